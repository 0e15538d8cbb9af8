"""Loaders of real datasets (pipeline.data.table / folders / cub / coco / syn) on tiny fixtures in the real layouts.

Every fixture is written by the test itself: a few real PNG/JPEG files via PIL and the published text,
JSON and CSV formats, small enough that every expected value below is worked out by hand.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.data import syn_benchmarks as syn_module
from pipeline.data.coco import COCO_CATEGORY_NAMES, load_coco
from pipeline.data.cub import attribute_phrase, class_phrase, load_cub
from pipeline.data.folders import load_folders
from pipeline.data.images import BadImage, load_image, load_images
from pipeline.data.syn_benchmarks import HubUnavailable, fetch_syn, load_syn
from pipeline.data.table import ImageTable, LayoutError, PairTable, assign_split, check_fractions, join_words, with_article


def write_image(path: Path, colour: tuple[int, int, int] = (200, 30, 40), size: tuple[int, int] = (8, 8)) -> Path:
    """A solid-colour image; the suffix picks the format (PNG lossless, JPEG lossy)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)
    return path


def write_garbage(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"this is not an image\n")
    return path


# =========================================================================================================
# table: load_image, splits, schema


def test_load_image_centre_crops_the_longer_side_exactly(tmp_path: Path) -> None:
    # 8 wide x 4 high, column x has value 10 * x: the shorter side is already 4, so only the crop acts,
    # keeping columns 2..5
    pixels = np.zeros((4, 8, 3), dtype=np.uint8)
    pixels[:, :, 0] = (np.arange(8) * 10)[None, :]
    pixels[:, :, 1] = (np.arange(4) * 50)[:, None]
    Image.fromarray(pixels).save(tmp_path / "wide.png")
    out = load_image(tmp_path / "wide.png", 4)
    assert out.dtype == np.uint8 and out.shape == (4, 4, 3)
    np.testing.assert_array_equal(out[0, :, 0], [20, 30, 40, 50])
    np.testing.assert_array_equal(out[:, 0, 1], [0, 50, 100, 150])
    # the same transposed: a tall image keeps rows 2..5
    Image.fromarray(pixels.transpose(1, 0, 2).copy()).save(tmp_path / "tall.png")
    np.testing.assert_array_equal(load_image(tmp_path / "tall.png", 4)[:, 0, 0], [20, 30, 40, 50])


def test_load_image_resizes_the_shorter_side_and_converts_modes(tmp_path: Path) -> None:
    write_image(tmp_path / "solid.png", (12, 34, 56), (20, 10))
    out = load_image(tmp_path / "solid.png", 5)
    assert out.shape == (5, 5, 3)
    assert (out == np.array([12, 34, 56], dtype=np.uint8)).all()
    # upscaling works too
    assert (load_image(tmp_path / "solid.png", 30) == np.array([12, 34, 56], dtype=np.uint8)).all()
    # greyscale -> three equal channels
    Image.new("L", (6, 6), 77).save(tmp_path / "grey.png")
    assert (load_image(tmp_path / "grey.png", 6) == 77).all()
    # 16-bit greyscale is scaled to 8 bits: 25700 / 257 = 100 (a plain PIL conversion would clip it to 255)
    Image.fromarray(np.full((6, 6), 25700, dtype=np.uint16)).save(tmp_path / "grey16.png")
    assert (load_image(tmp_path / "grey16.png", 6) == 100).all()
    # fully transparent pixels become white, opaque ones keep their colour
    rgba = np.zeros((6, 6, 4), dtype=np.uint8)
    rgba[:, :3] = (10, 20, 30, 255)
    Image.fromarray(rgba).save(tmp_path / "alpha.png")
    out = load_image(tmp_path / "alpha.png", 6)
    assert (out[:, :3] == np.array([10, 20, 30], dtype=np.uint8)).all()
    assert (out[:, 3:] == 255).all()


def test_load_image_applies_exif_orientation(tmp_path: Path) -> None:
    # stored 16 x 8: left half red, right half blue; EXIF orientation 6 = rotate 90 degrees clockwise to
    # display, so the displayed image is 8 x 16 with red on top; the 8 x 8 centre crop is half red, half blue
    pixels = np.zeros((8, 16, 3), dtype=np.uint8)
    pixels[:, :8] = (255, 0, 0)
    pixels[:, 8:] = (0, 0, 255)
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(pixels).save(tmp_path / "rotated.jpg", exif=exif, quality=95)
    out = load_image(tmp_path / "rotated.jpg", 8).astype(int)
    assert out[1, 4, 0] > 200 and out[1, 4, 2] < 60  # top: red
    assert out[6, 4, 2] > 200 and out[6, 4, 0] < 60  # bottom: blue


def test_load_image_raises_bad_image_for_missing_garbage_and_truncated_files(tmp_path: Path) -> None:
    with pytest.raises(BadImage, match="file not found") as info:
        load_image(tmp_path / "absent.png", 4)
    assert info.value.path == tmp_path / "absent.png"
    with pytest.raises(BadImage, match="garbage.jpg: unreadable image"):
        load_image(write_garbage(tmp_path / "garbage.jpg"), 4)
    noisy = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noisy).save(tmp_path / "full.png")
    data = (tmp_path / "full.png").read_bytes()
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
    with pytest.raises(BadImage, match="cut.png"):
        load_image(tmp_path / "cut.png", 8)
    assert issubclass(BadImage, ValueError)


def test_load_image_checks_size_and_load_images_stacks(tmp_path: Path) -> None:
    write_image(tmp_path / "a.png", (1, 2, 3))
    write_image(tmp_path / "b.png", (4, 5, 6))
    with pytest.raises(ValueError, match="size: expected an integer >= 1"):
        load_image(tmp_path / "a.png", 0)
    with pytest.raises(TypeError, match="size: expected an integer"):
        load_image(tmp_path / "a.png", 4.0)  # type: ignore[arg-type]
    batch = load_images([tmp_path / "a.png", tmp_path / "b.png"], 3)
    assert batch.shape == (2, 3, 3, 3) and batch.dtype == np.uint8
    np.testing.assert_array_equal(batch[:, 0, 0], [[1, 2, 3], [4, 5, 6]])


def test_assign_split_is_stratified_with_hand_computed_counts() -> None:
    # class 0: 10 rows -> cuts at rint(8) = 8 and rint(9) = 9: 8 / 1 / 1
    # class 1: 5 rows -> cuts at rint(4) = 4 and rint(4.5) = 4 (round half to even): 4 / 0 / 1
    groups = np.array([0] * 10 + [1] * 5)
    codes = assign_split(groups, (0.8, 0.1, 0.1), seed=3)
    assert codes.dtype == np.int8
    assert np.bincount(codes[groups == 0], minlength=3).tolist() == [8, 1, 1]
    assert np.bincount(codes[groups == 1], minlength=3).tolist() == [4, 0, 1]
    np.testing.assert_array_equal(codes, assign_split(groups, (0.8, 0.1, 0.1), seed=3))
    many = np.zeros(200, dtype=np.int64)
    assert not np.array_equal(assign_split(many, (0.5, 0.25, 0.25), 0), assign_split(many, (0.5, 0.25, 0.25), 1))
    assert np.bincount(assign_split(many, (0.5, 0.25, 0.25), 0)).tolist() == [100, 50, 50]
    assert assign_split(np.zeros(0), (0.8, 0.1, 0.1), 0).shape == (0,)


def test_check_fractions_rejects_bad_splits() -> None:
    assert check_fractions([0.5, 0.5, 0]) == (0.5, 0.5, 0.0)
    with pytest.raises(ValueError, match="sum to 1"):
        check_fractions((0.5, 0.1, 0.1))
    with pytest.raises(ValueError, match="three non-negative"):
        check_fractions((0.5, 0.5))
    with pytest.raises(ValueError, match="three fractions"):
        check_fractions("abc")


def test_caption_helpers() -> None:
    assert with_article("owl") == "an owl" and with_article("dog") == "a dog"
    assert join_words([]) == "" and join_words(["x"]) == "x"
    assert join_words(["x", "y", "z"]) == "x, y and z"


def test_tables_reject_inconsistent_fields(tmp_path: Path) -> None:
    good = dict(kind="x", paths=[tmp_path / "a.png"], attributes=np.zeros((1, 2), dtype=bool), attribute_names=["p", "q"],
                families={"f": [0, 1]}, captions=["c"], split=np.zeros(1, dtype=np.int8), labels=None, class_names=None)
    assert len(ImageTable(**good)) == 1
    with pytest.raises(ValueError, match="captions: expected 1"):
        ImageTable(**{**good, "captions": []})
    with pytest.raises(ValueError, match="families"):
        ImageTable(**{**good, "families": {"f": [2]}})
    with pytest.raises(ValueError, match="labels and class_names"):
        ImageTable(**{**good, "labels": np.zeros(1, dtype=np.int64)})
    with pytest.raises(ValueError, match=r"added in \[-1, 2\)"):
        PairTable([tmp_path / "a"], [tmp_path / "b"], np.zeros((1, 2), bool), np.zeros((1, 2), bool),
                  np.zeros(1, np.int64), ["f"], np.zeros(1, np.int64), np.full(1, 5, np.int64))


# =========================================================================================================
# folders


def make_folders(root: Path, per_class: int = 10) -> None:
    for c, name in enumerate(["cat", "owl"]):
        for i in range(per_class):
            suffix = ".png" if i % 2 == 0 else ".JPG"
            write_image(root / name / f"img_{i:02d}{suffix}", (c * 100, i * 10, 50), (6, 5))


def test_folders_classes_labels_captions_and_split(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    make_folders(tmp_path)
    write_image(tmp_path / "owl" / "nested" / "deep.jpeg")  # images at any depth count
    (tmp_path / "owl" / "notes.txt").write_text("not an image")  # skipped with a warning
    write_garbage(tmp_path / "cat" / ".DS_Store")  # hidden: ignored
    write_garbage(tmp_path / ".cache" / "x.png")  # hidden folder: not a class
    with caplog.at_level(logging.WARNING):
        table = load_folders(tmp_path, split=(0.8, 0.1, 0.1), seed=0)
    assert "skipped 1 files" in caplog.text
    assert table.kind == "folders" and len(table) == 21
    assert table.class_names == ["cat", "owl"] and table.attribute_names == ["cat", "owl"]
    assert table.labels is not None and table.labels.tolist() == [0] * 10 + [1] * 11
    assert table.paths[0] == tmp_path / "cat" / "img_00.png"
    assert table.paths[10] == tmp_path / "owl" / "img_00.png"
    assert table.paths[-1] == tmp_path / "owl" / "nested" / "deep.jpeg"
    np.testing.assert_array_equal(table.attributes, np.eye(2, dtype=bool)[table.labels])
    assert table.families == {"class": [0, 1]}
    assert table.captions[0] == "a photo of a cat." and table.captions[-1] == "a photo of an owl."
    # per class: 10 -> 8 / 1 / 1; 11 -> cuts at rint(8.8) = 9 and rint(9.9) = 10: 9 / 1 / 1
    assert np.bincount(table.split[:10], minlength=3).tolist() == [8, 1, 1]
    assert np.bincount(table.split[10:], minlength=3).tolist() == [9, 1, 1]
    np.testing.assert_array_equal(table.split, load_folders(tmp_path, seed=0).split)


def test_folders_names_mapping(tmp_path: Path) -> None:
    make_folders(tmp_path, per_class=1)
    table = load_folders(tmp_path, names={"cat": "tabby cat"})
    assert table.class_names == ["tabby cat", "owl"] and table.captions == ["a photo of a tabby cat.", "a photo of an owl."]
    with pytest.raises(ValueError, match="names: folder names not found"):
        load_folders(tmp_path, names={"dog": "dog"})


def test_folders_layout_errors(tmp_path: Path) -> None:
    with pytest.raises(LayoutError, match="is not a directory"):
        load_folders(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LayoutError, match="has no class sub-folders"):
        load_folders(tmp_path / "empty")
    write_image(tmp_path / "loose" / "x.png")
    with pytest.raises(LayoutError, match=r"lies directly in .*expected root/<class>/<image files>"):
        load_folders(tmp_path / "loose")
    make_folders(tmp_path / "noimg", per_class=1)
    (tmp_path / "noimg" / "dog").mkdir()
    (tmp_path / "noimg" / "dog" / "readme.md").write_text("x")
    with pytest.raises(LayoutError, match=r"class folder .*dog has no image files"):
        load_folders(tmp_path / "noimg")
    with pytest.raises(ValueError, match="split: fractions must sum to 1"):
        load_folders(tmp_path / "loose", split=(0.5, 0.1, 0.1))


def test_folders_unreadable_image(tmp_path: Path) -> None:
    make_folders(tmp_path, per_class=2)
    bad = write_garbage(tmp_path / "owl" / "broken.png")
    with pytest.raises(BadImage, match="broken.png: unreadable image") as info:
        load_folders(tmp_path)
    assert info.value.path == bad
    assert len(load_folders(tmp_path, check=False)) == 5  # the header check is optional


# =========================================================================================================
# CUB


CUB_ATTRIBUTES = ["has_bill_shape::dagger", "has_bill_shape::curved_(up_or_down)", "has_primary_color::blue",
                  "has_primary_color::black", "has_size::small_(5_-_9_in)"]
CUB_CLASSES = ["001.Black_footed_Albatross", "002.Laysan_Albatross", "003.Sooty_Albatross"]
# images 1..8: class, is_training_image, present attributes (1-based ids)
CUB_IMAGES = [(1, 1, [1, 4, 5]), (1, 1, [2]), (1, 0, [3, 4]), (2, 1, []), (2, 1, [1, 3]), (2, 0, [5]), (3, 1, [2, 4]), (3, 0, [1])]


def make_cub(root: Path, attributes_at: str = "attributes") -> None:
    """A CUB_200_2011 folder in the released layout with 8 images, 3 classes and 5 attributes."""
    rel = [f"{CUB_CLASSES[c - 1]}/{CUB_CLASSES[c - 1].split('.')[1]}_{i + 1:04d}.jpg" for i, (c, _, _) in enumerate(CUB_IMAGES)]
    for i, path in enumerate(rel):
        write_image(root / "images" / path, (30 * i, 20, 20))
    (root / "images.txt").write_text("".join(f"{i + 1} {p}\n" for i, p in enumerate(rel)))
    (root / "classes.txt").write_text("".join(f"{c + 1} {name}\n" for c, name in enumerate(CUB_CLASSES)))
    (root / "image_class_labels.txt").write_text("".join(f"{i + 1} {c}\n" for i, (c, _, _) in enumerate(CUB_IMAGES)))
    (root / "train_test_split.txt").write_text("".join(f"{i + 1} {t}\n" for i, (_, t, _) in enumerate(CUB_IMAGES)))
    names = "".join(f"{a + 1} {name}\n" for a, name in enumerate(CUB_ATTRIBUTES))
    target = {"attributes": root / "attributes" / "attributes.txt", "parent": root.parent / "attributes.txt"}[attributes_at]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(names)
    lines = []
    for i, (_, _, present) in enumerate(CUB_IMAGES):
        for a in range(1, len(CUB_ATTRIBUTES) + 1):
            lines.append(f"{i + 1} {a} {int(a in present)} {1 + (a % 4)} {i * 1.5 + a:.3f}")
    lines[7] += " 0"  # the release's quirk: a few lines carry an extra field
    order = np.random.default_rng(0).permutation(len(lines))  # record order does not matter
    (root / "attributes").mkdir(exist_ok=True)
    (root / "attributes" / "image_attribute_labels.txt").write_text("".join(lines[k] + "\n" for k in order))


def expected_cub_attributes() -> np.ndarray:
    out = np.zeros((len(CUB_IMAGES), len(CUB_ATTRIBUTES)), dtype=bool)
    for i, (_, _, present) in enumerate(CUB_IMAGES):
        out[i, [a - 1 for a in present]] = True
    return out


def test_cub_loads_attributes_families_labels_and_captions(tmp_path: Path) -> None:
    root = tmp_path / "CUB_200_2011"
    make_cub(root)
    table = load_cub(root, val_fraction=0.5, seed=0)
    assert table.kind == "cub" and len(table) == 8
    np.testing.assert_array_equal(table.attributes, expected_cub_attributes())
    assert table.attribute_names == ["dagger bill shape", "curved (up or down) bill shape", "blue primary color",
                                     "black primary color", "small (5 - 9 in) size"]
    assert table.families == {"has_bill_shape": [0, 1], "has_primary_color": [2, 3], "has_size": [4]}
    assert table.labels is not None and table.labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2]
    assert table.class_names == ["Black footed Albatross", "Laysan Albatross", "Sooty Albatross"]
    assert table.paths[0] == root / "images" / "001.Black_footed_Albatross" / "Black_footed_Albatross_0001.jpg"
    assert table.captions[0] == ("a photo of a Black footed Albatross, a bird with black primary color, "
                                 "dagger bill shape and small (5 - 9 in) size.")
    assert table.captions[3] == "a photo of a Laysan Albatross, a bird."
    # official test images (3, 6, 8) -> 2; training images per class: 2, 2, 1 with val_fraction 0.5 ->
    # cuts at rint(1) = 1: one train, one validation; the single one of class 3: rint(0.5) = 0 -> validation
    assert np.flatnonzero(table.split == 2).tolist() == [2, 5, 7]
    assert np.bincount(table.split, minlength=3).tolist() == [2, 3, 3]
    assert sorted(table.split[[0, 1]].tolist()) == [0, 1] and sorted(table.split[[3, 4]].tolist()) == [0, 1]
    assert table.split[6] == 1
    no_val = load_cub(root, val_fraction=0.0)
    assert np.bincount(no_val.split, minlength=3).tolist() == [5, 0, 3]


def test_cub_finds_the_attribute_list_beside_the_folder(tmp_path: Path) -> None:
    root = tmp_path / "CUB_200_2011"
    make_cub(root, attributes_at="parent")  # where the release archive puts it
    assert len(load_cub(root).attribute_names) == 5


def test_cub_phrases() -> None:
    assert attribute_phrase("has_shape::perching-like") == "perching-like shape"
    assert class_phrase("200.Common_Yellowthroat") == "Common Yellowthroat"


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize(("file", "old", "new", "message"), [
    ("images.txt", "2 001.", "2", r"images.txt:2: expected 2 fields 'image_id path', got 1"),
    ("images.txt", "2 001.", "1 001.", r"images.txt:2: duplicate image_id 1"),
    ("images.txt", "3 001.", "x 001.", r"images.txt:3: image_id must be an integer, got 'x'"),
    ("image_class_labels.txt", "5 2\n", "99 2\n", r"image_class_labels.txt:5: image_id 99 not found in images.txt"),
    ("image_class_labels.txt", "5 2\n", "5 7\n", r"image_class_labels.txt:5: class_id 7 not found in classes.txt"),
    ("image_class_labels.txt", "5 2\n", "", r"image_id 5 \(from images.txt\) has no line"),
    ("train_test_split.txt", "4 1\n", "4 2\n", r"train_test_split.txt:4: is_training_image must be 0 or 1, got 2"),
    ("attributes/attributes.txt", "3 has_primary_color::blue", "3 blue", r"attributes.txt:3: expected an attribute name 'has_family::value'"),
    ("attributes/attributes.txt", "3 has_primary", "4 has_primary", r"attributes.txt:3: expected attribute_id 3"),
])
def test_cub_text_file_errors_name_file_line_and_expectation(tmp_path: Path, file: str, old: str, new: str, message: str) -> None:
    root = tmp_path / "CUB_200_2011"
    make_cub(root)
    _edit(root / file, old, new)
    with pytest.raises(LayoutError, match=message):
        load_cub(root)


def _label_lines(root: Path) -> list[str]:
    return (root / "attributes" / "image_attribute_labels.txt").read_text().splitlines()


def _write_label_lines(root: Path, lines: list[str]) -> None:
    (root / "attributes" / "image_attribute_labels.txt").write_text("\n".join(lines) + "\n")


def test_cub_attribute_label_errors(tmp_path: Path) -> None:
    root = tmp_path / "CUB_200_2011"
    make_cub(root)
    lines = _label_lines(root)
    _write_label_lines(root, lines[:4] + [" ".join(lines[4].split()[:4])] + lines[5:])  # 4 fields on line 5
    with pytest.raises(LayoutError, match=r"image_attribute_labels.txt:5: expected at least 5 fields 'image_id attribute_id is_present certainty_id time', got 4"):
        load_cub(root)
    fields = lines[2].split()
    _write_label_lines(root, lines[:2] + [" ".join([fields[0], "x", *fields[2:]])] + lines[3:])
    with pytest.raises(LayoutError, match=r"image_attribute_labels.txt:3: attribute_id must be a number, got 'x'"):
        load_cub(root)
    fields = lines[0].split()
    _write_label_lines(root, [" ".join([fields[0], "9", *fields[2:]])] + lines[1:])
    with pytest.raises(LayoutError, match=r"record 1: attribute_id 9 not found in attributes.txt \(ids 1..5\)"):
        load_cub(root)
    _write_label_lines(root, [" ".join(["42", *fields[1:]])] + lines[1:])
    with pytest.raises(LayoutError, match=r"record 1: image_id 42 not found in images.txt"):
        load_cub(root)
    _write_label_lines(root, [" ".join([*fields[:2], "3", *fields[3:]])] + lines[1:])
    with pytest.raises(LayoutError, match=r"record 1: is_present must be 0 or 1, got 3"):
        load_cub(root)
    image, attribute = fields[0], fields[1]
    _write_label_lines(root, lines[1:])  # one (image, attribute) record dropped
    with pytest.raises(LayoutError, match=rf"image_id {image} attribute_id {attribute} has 0 records"):
        load_cub(root)
    _write_label_lines(root, lines + lines[:1])
    with pytest.raises(LayoutError, match=rf"image_id {image} attribute_id {attribute} has 2 records"):
        load_cub(root)


def test_cub_missing_files_and_images(tmp_path: Path) -> None:
    root = tmp_path / "CUB_200_2011"
    make_cub(root)
    (root / "classes.txt").rename(root / "classes.bak")
    with pytest.raises(LayoutError, match=r"CUB: missing file .*classes.txt \(expected lines 'class_id class_name'\)"):
        load_cub(root)
    (root / "classes.bak").rename(root / "classes.txt")
    (root / "attributes" / "attributes.txt").unlink()
    with pytest.raises(LayoutError, match=r"CUB: missing file .*attributes.txt"):
        load_cub(root)
    make_cub(root)
    victim = root / "images" / "002.Laysan_Albatross" / "Laysan_Albatross_0005.jpg"
    victim.unlink()
    with pytest.raises(BadImage, match=r"Laysan_Albatross_0005.jpg: unreadable image \(file not found \(listed in images.txt\)\)"):
        load_cub(root)
    with pytest.raises(BadImage, match="file not found"):
        load_cub(root, check=False)  # existence is always checked
    write_garbage(victim)
    with pytest.raises(BadImage, match="Laysan_Albatross_0005.jpg: unreadable image"):
        load_cub(root)
    with pytest.raises(LayoutError, match="is not a directory"):
        load_cub(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="val_fraction"):
        load_cub(root, val_fraction=1.0)


# =========================================================================================================
# COCO


def make_coco(root: Path, split_name: str = "val2017") -> dict:
    """instances_<split>.json with 3 images (ids 42, 7, 13), 3 categories (ids 18, 1, 3), 4 annotations."""
    data = {
        "info": {"description": "fixture"},
        "images": [{"id": 42, "file_name": "000000000042.jpg", "width": 8, "height": 6},
                   {"id": 7, "file_name": "000000000007.jpg", "width": 8, "height": 6},
                   {"id": 13, "file_name": "000000000013.png", "width": 8, "height": 6}],
        "annotations": [{"id": 1, "image_id": 7, "category_id": 1, "bbox": [0, 0, 2, 2], "iscrowd": 0},
                        {"id": 2, "image_id": 7, "category_id": 18, "bbox": [1, 1, 2, 2], "iscrowd": 0},
                        {"id": 3, "image_id": 7, "category_id": 18, "bbox": [2, 2, 2, 2], "iscrowd": 1},
                        {"id": 4, "image_id": 42, "category_id": 3, "bbox": [0, 0, 4, 4], "iscrowd": 0}],
        "categories": [{"id": 18, "name": "dog", "supercategory": "animal"},
                       {"id": 1, "name": "person", "supercategory": "person"},
                       {"id": 3, "name": "car", "supercategory": "vehicle"}],
    }
    for image in data["images"]:
        write_image(root / split_name / image["file_name"], (90, 90, 90), (8, 6))
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    (root / "annotations" / f"instances_{split_name}.json").write_text(json.dumps(data))
    return data


def test_coco_multi_hot_labels_in_category_id_order(tmp_path: Path) -> None:
    make_coco(tmp_path)
    table = load_coco(tmp_path, "val2017", split=None)
    assert table.kind == "coco" and len(table) == 3
    assert table.paths == [tmp_path / "val2017" / "000000000007.jpg", tmp_path / "val2017" / "000000000013.png",
                           tmp_path / "val2017" / "000000000042.jpg"]
    assert table.attribute_names == ["person", "car", "dog"]
    np.testing.assert_array_equal(table.attributes, [[True, False, True], [False, False, False], [False, True, False]])
    assert table.captions == ["a photo of a person and a dog.", "a photo of a scene.", "a photo of a car."]
    assert table.families == {"object": [0, 1, 2]}
    assert table.labels is None and table.class_names is None
    assert table.split.tolist() == [1, 1, 1]  # "val*" -> validation when no fractions are given
    # seeded random split: n = 3 -> cuts at rint(2.4) = 2 and rint(2.7) = 3: 2 / 1 / 0
    split = load_coco(tmp_path, split=(0.8, 0.1, 0.1), seed=5).split
    assert np.bincount(split, minlength=3).tolist() == [2, 1, 0]
    np.testing.assert_array_equal(split, load_coco(tmp_path, split=(0.8, 0.1, 0.1), seed=5).split)


def test_coco_category_names() -> None:
    assert len(COCO_CATEGORY_NAMES) == 80 and COCO_CATEGORY_NAMES[0] == "person" and COCO_CATEGORY_NAMES[-1] == "toothbrush"


def test_coco_images_dir_override(tmp_path: Path) -> None:
    make_coco(tmp_path)
    (tmp_path / "val2017").rename(tmp_path / "elsewhere")
    with pytest.raises(LayoutError, match=r"image folder .*val2017 is not a directory"):
        load_coco(tmp_path)
    assert load_coco(tmp_path, images_dir=tmp_path / "elsewhere").paths[0] == tmp_path / "elsewhere" / "000000000007.jpg"


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.pop("categories"), r"missing keys \['categories'\]"),
    (lambda d: d["annotations"][2].update(image_id=99), r"annotations\[2\]: image_id 99 not found in 'images'"),
    (lambda d: d["annotations"][3].update(category_id=5), r"annotations\[3\]: category_id 5 not found in 'categories'"),
    (lambda d: d["images"][1].pop("file_name"), r"images\[1\] \(id 7, field 'file_name'\) must be a string, got None"),
    (lambda d: d["images"][2].update(id=42), r"image id 42 appears 2 times"),
    (lambda d: d["annotations"][0].update(image_id="7"), r"annotations\[0\] \(id 1, field 'image_id'\) must be an integer"),
])
def test_coco_json_errors(tmp_path: Path, change, message: str) -> None:  # type: ignore[no-untyped-def]
    data = make_coco(tmp_path)
    change(data)
    (tmp_path / "annotations" / "instances_val2017.json").write_text(json.dumps(data))
    with pytest.raises(LayoutError, match=message):
        load_coco(tmp_path)


def test_coco_missing_invalid_and_unreadable(tmp_path: Path) -> None:
    with pytest.raises(LayoutError, match=r"COCO: missing file .*annotations/instances_val2017.json"):
        load_coco(tmp_path)
    make_coco(tmp_path)
    (tmp_path / "annotations" / "instances_val2017.json").write_text("{not json")
    with pytest.raises(LayoutError, match="instances_val2017.json: not valid JSON"):
        load_coco(tmp_path)
    make_coco(tmp_path)
    write_garbage(tmp_path / "val2017" / "000000000013.png")
    with pytest.raises(BadImage, match=r"000000000013.png: unreadable image .*listed in instances_val2017.json"):
        load_coco(tmp_path)
    (tmp_path / "val2017" / "000000000013.png").unlink()
    with pytest.raises(BadImage, match="000000000013.png: unreadable image \\(file not found"):
        load_coco(tmp_path, check=False)
    with pytest.raises(ValueError, match="split: None needs a split_name"):
        load_coco(tmp_path, split_name="minival", split=None)


# =========================================================================================================
# synCUB / synCOCO


SYNCUB_HEADER = "pair_id,orig_image,syn_image,class_id,class_name,old_attr,new_attr,old_attr_idx,new_attr_idx,orig_attr_idx,syn_attr_idx"


def make_syncub(root: Path) -> list[str]:
    """Three pairs in the published layout; pairs 0 and 2 share a base image (to test deduplication)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "attributes.txt").write_text("".join(f"{a + 1} {name}\n" for a, name in enumerate(CUB_ATTRIBUTES)))
    for name in ["000000_orig.jpg", "000000_syn.jpg", "000001_orig.png", "000001_syn.png", "000002_syn.jpg"]:
        write_image(root / "images" / name, (10, 200, 30))
    rows = [
        SYNCUB_HEADER,
        '0,images/000000_orig.jpg,images/000000_syn.jpg,1,Black_footed_Albatross,has_bill_shape::dagger,'
        'has_bill_shape::curved_(up_or_down),0,1,"[0, 3]","[1, 3]"',
        '1,images/000001_orig.png,images/000001_syn.png,3,Sooty_Albatross,has_primary_color::blue,'
        'has_primary_color::black,2,3,"[2, 4]","[3, 4]"',
        '2,images/000000_orig.jpg,images/000002_syn.jpg,1,Black_footed_Albatross,has_primary_color::black,'
        'has_primary_color::blue,3,2,"[0, 3]","[0, 2]"',
    ]
    (root / "metadata.csv").write_text("\n".join(rows) + "\n")
    return rows


SYNCOCO_HEADER = "pair_id,orig_image,syn_image,coco_idx,removed_cls_idx,removed_class,orig_labels,syn_labels"


def make_syncoco(root: Path) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    for name in ["000000_orig.jpg", "000000_syn.jpg", "000001_orig.jpg", "000001_syn.jpg"]:
        write_image(root / "images" / name, (120, 120, 200))
    rows = [
        SYNCOCO_HEADER,
        '0,images/000000_orig.jpg,images/000000_syn.jpg,139,16,dog,"[0, 16, 56]","[0, 56]"',
        '1,images/000001_orig.jpg,images/000001_syn.jpg,285,0,person,"[0]","[]"',
    ]
    (root / "metadata.csv").write_text("\n".join(rows) + "\n")
    return rows


def test_syncub_pairs_and_base_table(tmp_path: Path) -> None:
    root = tmp_path / "syncub"
    make_syncub(root)
    table, pairs = load_syn(root)
    assert table.kind == "syncub" and len(table) == 2 and len(pairs) == 3
    assert table.paths == [root / "images" / "000000_orig.jpg", root / "images" / "000001_orig.png"]
    assert pairs.before == [root / "images" / "000000_orig.jpg", root / "images" / "000001_orig.png",
                            root / "images" / "000000_orig.jpg"]
    assert pairs.after[2] == root / "images" / "000002_syn.jpg"
    assert pairs.base_index.tolist() == [0, 1, 0]
    assert pairs.removed.tolist() == [0, 2, 3] and pairs.added.tolist() == [1, 3, 2]
    assert pairs.family == ["has_bill_shape", "has_primary_color", "has_primary_color"]
    np.testing.assert_array_equal(pairs.before_attributes, [[1, 0, 0, 1, 0], [0, 0, 1, 0, 1], [1, 0, 0, 1, 0]])
    np.testing.assert_array_equal(pairs.after_attributes, [[0, 1, 0, 1, 0], [0, 0, 0, 1, 1], [1, 0, 1, 0, 0]])
    np.testing.assert_array_equal(table.attributes, pairs.before_attributes[[0, 1]])
    assert table.attribute_names[1] == "curved (up or down) bill shape"
    assert table.families == {"has_bill_shape": [0, 1], "has_primary_color": [2, 3], "has_size": [4]}
    assert table.labels is not None and table.labels.tolist() == [0, 2]  # CUB class id - 1
    assert table.class_names == ["Black footed Albatross", "class 2", "Sooty Albatross"]
    assert table.split.tolist() == [2, 2]
    assert table.captions[0] == "a photo of a Black footed Albatross, a bird with black primary color and dagger bill shape."


def test_syncoco_pairs_and_base_table(tmp_path: Path) -> None:
    root = tmp_path / "syncoco"
    make_syncoco(root)
    table, pairs = load_syn(root)
    assert table.kind == "syncoco" and len(table) == 2 and len(pairs) == 2
    assert table.attribute_names == list(COCO_CATEGORY_NAMES) and table.families == {"object": list(range(80))}
    assert pairs.removed.tolist() == [16, 0] and pairs.added.tolist() == [-1, -1]
    assert pairs.family == ["object", "object"] and pairs.base_index.tolist() == [0, 1]
    assert np.flatnonzero(pairs.before_attributes[0]).tolist() == [0, 16, 56]
    assert np.flatnonzero(pairs.after_attributes[0]).tolist() == [0, 56]
    assert not pairs.after_attributes[1].any()
    assert table.captions == ["a photo of a person, a dog and a chair.", "a photo of a person."]
    assert table.labels is None and table.class_names is None


def test_syn_warns_about_pairs_whose_labels_do_not_show_the_edit(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "syncoco"
    make_syncoco(root)
    _edit(root / "metadata.csv", '"[0]","[]"', '"[0]","[0]"')  # person still present after its removal
    with caplog.at_level(logging.WARNING):
        _, pairs = load_syn(root)
    assert "1 of 2 pairs have labels that do not show the edit" in caplog.text
    assert len(pairs) == 2  # kept as published


@pytest.mark.parametrize(("old", "new", "message"), [
    (",0,1,\"[0, 3]\"", ",1,2,\"[0, 3]\"", r"metadata.csv:2: old_attr 'has_bill_shape::dagger' does not match attributes.txt id 2"),
    (",0,1,\"[0, 3]\"", ",0,7,\"[0, 3]\"", r"metadata.csv:2: new_attr_idx 7 out of range \(expected 0..4\)"),
    ('"[2, 4]"', '"2, 4"', r"metadata.csv:3: orig_attr_idx must be a list like \[3, 17\], got '2, 4'"),
    ('"[2, 4]"', '"[2, x]"', r"metadata.csv:3: orig_attr_idx must be a list of integers"),
    ('"[2, 4]"', '"[2, 5]"', r"metadata.csv:3: orig_attr_idx has index 5 out of range"),
    (",3,Sooty", ",three,Sooty", r"metadata.csv:3: class_id must be an integer, got 'three'"),
    (',"[0, 3]","[0, 2]"', ',"[0, 3]"', r"metadata.csv:4: expected 11 fields .*got 10"),
    (',"[0, 3]","[0, 2]"', ',"[0, 3]","[0, 2]",9', r"metadata.csv:4: expected 11 fields .*got 12"),
    # pair 2 reuses pair 0's base image but lists other labels for it
    ('3,2,"[0, 3]","[0, 2]"', '3,2,"[0, 3, 4]","[0, 2, 4]"', r"metadata.csv:4: base image .*000000_orig.jpg has other labels than on line 2"),
])
def test_syncub_metadata_errors(tmp_path: Path, old: str, new: str, message: str) -> None:
    root = tmp_path / "syncub"
    make_syncub(root)
    _edit(root / "metadata.csv", old, new)
    with pytest.raises(LayoutError, match=message):
        load_syn(root)


def test_syn_layout_errors(tmp_path: Path) -> None:
    with pytest.raises(LayoutError, match="neither a local folder nor one of jokl/syncoco, jokl/syncub"):
        load_syn(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LayoutError, match=r"syn: missing file .*metadata.csv"):
        load_syn(tmp_path / "empty")
    root = tmp_path / "syncub"
    make_syncub(root)
    _edit(root / "metadata.csv", "old_attr_idx,", "old_index,")
    with pytest.raises(LayoutError, match=r"not a synCUB or synCOCO table; synCUB needs columns \['old_attr_idx'\]"):
        load_syn(root)
    make_syncub(root)
    (root / "attributes.txt").unlink()
    with pytest.raises(LayoutError, match=r"synCUB: missing file .*attributes.txt"):
        load_syn(root)
    coco = tmp_path / "syncoco"
    make_syncoco(coco)
    _edit(coco / "metadata.csv", ",16,dog,", ",17,dog,")
    with pytest.raises(LayoutError, match=r"metadata.csv:2: removed_class 'dog' does not match COCO category 17 'horse'"):
        load_syn(coco)


def test_syn_unreadable_and_missing_images(tmp_path: Path) -> None:
    root = tmp_path / "syncoco"
    make_syncoco(root)
    write_garbage(root / "images" / "000001_syn.jpg")
    with pytest.raises(BadImage, match=r"000001_syn.jpg: unreadable image .*listed in metadata.csv"):
        load_syn(root)
    load_syn(root, check=False)  # header check off: existence only
    (root / "images" / "000001_syn.jpg").unlink()
    with pytest.raises(BadImage, match="000001_syn.jpg: unreadable image \\(file not found"):
        load_syn(root, check=False)


def test_syn_by_name_fails_fast_offline_without_a_cached_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubUnavailable, match=r"jokl/syncub@v1.0: cannot fetch \(HF_HUB_OFFLINE=1 and no cached copy\); "
                                             r"install `huggingface_hub` .* or pass a local copy"):
        load_syn("jokl/syncub", cache_dir=tmp_path / "cache")
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails as if not installed
    with pytest.raises(HubUnavailable, match="jokl/syncoco: huggingface_hub is not installed; install"):
        load_syn("synCOCO")
    with pytest.raises(ValueError, match="name: expected one of"):
        fetch_syn("jokl/other")


def test_syn_by_name_loads_the_fetched_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "snapshot"
    make_syncub(root)
    calls = []

    def fake_fetch(name: str, revision: str | None = None, cache_dir: Path | str | None = None) -> Path:
        calls.append((name, revision))
        return root

    monkeypatch.setattr(syn_module, "fetch_syn", fake_fetch)
    table, pairs = load_syn("jokl/syncub", revision="v1.0")
    assert calls == [("jokl/syncub", "v1.0")] and table.kind == "syncub" and len(pairs) == 3
