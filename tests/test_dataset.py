"""pipeline.data.dataset: two kinds of scene stacked into one dataset, read back per kind."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.data.dataset import edit_text, open_dataset, write_dataset
from pipeline.data.world import scenes as world
from pipeline.data.world.texts import attribute_phrases, zero_shot_prompts
from pipeline.data.world.vocabulary import vocabulary


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    objects = world.generate_objects(40, image_size=32, seed=1, split=(0.5, 0.25, 0.25))
    multi = world.generate_multi(20, image_size=32, seed=1, split=(0.5, 0.25, 0.25), max_objects=3)
    parts = [(objects, world.object_pairs(objects, 4, seed=2)), (multi, world.multi_pairs(multi, 3, seed=2))]
    root = tmp_path_factory.mktemp("ds") / "data"
    write_dataset(root, parts, vocabulary(), zero_shot_prompts("objects"), attribute_phrases, {"test": True})
    return open_dataset(root), parts


def test_rows_and_columns_are_stacked_in_kind_order(dataset):
    data, ((objects, _), (multi, _)) = dataset
    a_obj = objects.attributes.shape[1]
    assert data.kinds == ["objects", "multi"]
    assert data.columns("objects") == list(range(a_obj))
    assert data.columns("multi") == list(range(a_obj, a_obj + multi.attributes.shape[1]))
    np.testing.assert_array_equal(data.attributes[:40, :a_obj], objects.attributes)
    np.testing.assert_array_equal(data.attributes[40:, a_obj:], multi.attributes)
    assert not data.attributes[:40, a_obj:].any() and not data.attributes[40:, :a_obj].any()
    np.testing.assert_array_equal(data.images.read(40, 60), multi.images)
    assert data.captions[40:] == multi.captions
    assert data.families("multi") == {f: [c + a_obj for c in cols] for f, cols in multi.families.items()}
    assert data.one_hot("objects") and not data.one_hot("multi")


def test_split_rows_per_kind(dataset):
    data, ((objects, _), (multi, _)) = dataset
    np.testing.assert_array_equal(data.rows("test", "objects"), np.flatnonzero(objects.split == 2))
    np.testing.assert_array_equal(data.rows("test", "multi"), 40 + np.flatnonzero(multi.split == 2))
    assert len(data.rows("train")) == int((objects.split == 0).sum() + (multi.split == 0).sum())


def test_pairs_point_at_dataset_rows_and_columns(dataset):
    data, ((objects, obj_pairs), (multi, multi_pairs)) = dataset
    pairs = data.pairs
    a_obj = objects.attributes.shape[1]
    assert pairs.kind == ["objects"] * 4 + ["multi"] * 3
    np.testing.assert_array_equal(pairs.base_index[4:], multi_pairs.base_index + 40)
    np.testing.assert_array_equal(pairs.removed[4:], multi_pairs.removed + a_obj)
    assert (pairs.added[4:] == -1).all()
    np.testing.assert_array_equal(pairs.added[:4], obj_pairs.added)
    np.testing.assert_array_equal(pairs.after.read(0, 4), obj_pairs.after)
    for i in range(7):  # each pair's labels differ from its base image's only in the edited bits
        base = data.attributes[pairs.base_index[i]]
        np.testing.assert_array_equal(pairs.before_attributes[i], base)
        changed = set(np.flatnonzero(base != pairs.after_attributes[i]).tolist())
        assert changed == {pairs.removed[i]} | ({pairs.added[i]} if pairs.added[i] >= 0 else set())


def test_missing_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="run the scenes stage first"):
        open_dataset(tmp_path / "nothing")


def test_phrases_are_recorded_per_column(dataset):
    data, _ = dataset
    assert len(data.phrases) == len(data.attribute_names)
    assert data.phrases[data.attribute_names.index("striped pattern")] == ["striped", "stripy"]
    assert data.phrases[data.attribute_names.index("tree")] == ["tree"]


def test_edit_text_names_the_edit():
    names = ["red body", "blue body", "tree"]
    assert edit_text(names, 0, 1) == "red body → blue body"
    assert edit_text(names, 2, -1) == "tree removed"
    with pytest.raises(ValueError, match="removed/added"):
        edit_text(names, 3, -1)


def test_labels_and_captions_are_read_by_row(dataset):
    data, ((objects, _), (multi, _)) = dataset
    rows = np.array([45, 3, 59])
    np.testing.assert_array_equal(data.labels(rows), data.attributes[rows])
    assert data.caption_rows(rows) == [data.captions[i] for i in rows] == [multi.captions[5], objects.captions[3], multi.captions[19]]
    assert "captions" not in data.meta, "captions live in a row store, not in meta.json"
    assert data.has_images and not data.has_embeddings and data.n == 60


def test_texts_round_trip_through_a_byte_row_store():
    from pipeline.data.dataset import decode_texts, encode_texts

    texts = ["a red thing", "", "ein grüner Vogel — 鳥", "x"]
    rows = encode_texts(texts)
    assert rows.dtype == np.uint8 and rows.shape == (4, len("ein grüner Vogel — 鳥".encode()))
    assert decode_texts(rows) == texts
    assert decode_texts(encode_texts([])) == []
