"""The procedural scene world (pipeline.data): determinism, labels, captions, splits, exact pairs, words."""

from __future__ import annotations

import re

import numpy as np
import pytest

from pipeline.data.table import assign_split
from pipeline.data.world import render
from pipeline.data.world import scenes as world
from pipeline.data.world.texts import with_articles, zero_shot_prompts
from pipeline.data.world.vocabulary import CATEGORIES, DISTRACTORS, FAMILIES, object_attribute_names, vocabulary


@pytest.fixture(scope="module")
def objects() -> world.SceneSet:
    return world.generate_objects(40, image_size=64, seed=3)


@pytest.fixture(scope="module")
def multi() -> world.SceneSet:
    return world.generate_multi(40, image_size=64, seed=3)


@pytest.fixture(scope="module")
def object_pair_set() -> tuple[world.SceneSet, world.PairSet]:
    scenes = world.generate_objects(250, image_size=48, seed=11, split=(0.1, 0.1, 0.8))
    return scenes, world.object_pairs(scenes, 200, seed=5)


@pytest.fixture(scope="module")
def multi_pair_set() -> tuple[world.SceneSet, world.PairSet]:
    scenes = world.generate_multi(250, image_size=48, seed=11, split=(0.1, 0.1, 0.8))
    return scenes, world.multi_pairs(scenes, 200, seed=5)


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z\-]+", text.lower()))


# ---------------------------------------------------------------------------------------------------------
# rendering primitives: hand-computed cases


def test_pattern_stripes_and_checks_hand_computed() -> None:
    x, y = np.arange(8, dtype=np.float32)[None, :], np.arange(2, dtype=np.float32)[:, None]
    stripes = render._pattern_on(render.Pattern("striped", (0.0, 0.0), 0.0, 4.0, (0.0, 0.0)), x, y)
    # pixel centres 0.5, 1.5, ... / period 4 -> fractional part < 0.5 for x = 0, 1, 4, 5
    assert stripes.astype(int).tolist() == [[1, 1, 0, 0, 1, 1, 0, 0]] * 2
    x4, y4 = np.arange(4, dtype=np.float32)[None, :], np.arange(4, dtype=np.float32)[:, None]
    checks = render._pattern_on(render.Pattern("checkered", (0.0, 0.0), 0.0, 2.0, (0.0, 0.0)), x4, y4)
    assert checks.astype(int).tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]]


def test_coverage_counts_covered_subpixels() -> None:
    # a filled 5 x 5 canvas-pixel square (0..4 inclusive) at factor 3 on a 4 px target:
    # target pixels (0,0) full, (0,1) and (1,0) 2 of 3 columns/rows, (1,1) 4 of 9 sub-pixels
    cover = render.coverage([render.Stroke(render.rect(0, 0, 4, 4), (255, 0, 0))], 4, 3)
    expected = np.zeros((4, 4), dtype=np.uint8)
    expected[0, 0] = 255
    expected[0, 1] = expected[1, 0] = 170  # 6/9 * 255
    expected[1, 1] = 113  # round(4/9 * 255)
    np.testing.assert_array_equal(cover, expected)


def test_compose_without_strokes_keeps_background_exactly() -> None:
    rng = np.random.default_rng(0)
    back = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    out = render.compose(back, [], 3, 1.0, np.zeros((8, 8, 3), np.float32))
    np.testing.assert_array_equal(out, back)


def test_place_rotates_scales_and_shifts() -> None:
    points = np.array([[1.0, 0.0], [0.0, 1.0]])
    placed = render.place(points, (10.0, 20.0), 2.0, angle=np.pi / 2)
    np.testing.assert_allclose(placed, [[10.0, 22.0], [8.0, 20.0]], atol=1e-12)


def test_articles_are_fixed() -> None:
    assert with_articles("a orange ball and a umbrella on a lawn") == "an orange ball and an umbrella on a lawn"


def test_supersampling_factor() -> None:
    assert [render.supersampling(s) for s in (32, 64, 100, 224)] == [6, 3, 2, 2]


# ---------------------------------------------------------------------------------------------------------
# generation: determinism, shapes, labels


@pytest.mark.parametrize("generate", [world.generate_objects, world.generate_multi])
def test_same_seed_same_arrays_different_seed_different(generate) -> None:
    a, b, c = generate(6, seed=1), generate(6, seed=1), generate(6, seed=2)
    for field in ("images", "attributes", "split", "seeds"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert a.captions == b.captions
    assert not np.array_equal(a.images, c.images)
    assert not np.array_equal(a.seeds, c.seeds)


def test_object_shapes_dtypes_and_families(objects: world.SceneSet) -> None:
    n, a = 40, 34
    assert objects.kind == "objects"
    assert objects.images.shape == (n, 64, 64, 3) and objects.images.dtype == np.uint8
    assert objects.attributes.shape == (n, a) and objects.attributes.dtype == bool
    assert objects.split.shape == (n,) and objects.split.dtype == np.int8
    assert objects.seeds.shape == (n,) and objects.seeds.dtype == np.int64 and (objects.seeds >= 0).all()
    assert len(objects.captions) == n and len(objects.attribute_names) == a
    assert len(objects.families) == 7 and len(set(objects.attribute_names)) == a
    columns = sorted(c for cols in objects.families.values() for c in cols)
    assert columns == list(range(a))  # the families partition the attributes
    for cols in objects.families.values():
        np.testing.assert_array_equal(objects.attributes[:, cols].sum(axis=1), 1)  # one-hot per family


def test_multi_shapes_and_labels(multi: world.SceneSet) -> None:
    assert multi.kind == "multi" and multi.max_objects == 5
    assert multi.images.shape == (40, 64, 64, 3) and multi.images.dtype == np.uint8
    assert multi.attributes.shape == (40, len(CATEGORIES)) and multi.attributes.dtype == bool
    assert multi.attribute_names == list(CATEGORIES) and len(CATEGORIES) >= 10
    assert multi.families == {"object": list(range(len(CATEGORIES)))}
    counts = multi.attributes.sum(axis=1)
    assert counts.min() >= 1 and counts.max() <= 5 and len(np.unique(counts)) >= 3


def test_max_objects_bounds_the_count() -> None:
    single = world.generate_multi(20, seed=4, max_objects=1)
    np.testing.assert_array_equal(single.attributes.sum(axis=1), 1)


def test_attributes_do_not_depend_on_image_size(objects: world.SceneSet) -> None:
    big = world.generate_objects(3, image_size=224, seed=3)
    assert big.images.shape == (3, 224, 224, 3) and big.images.dtype == np.uint8
    np.testing.assert_array_equal(big.attributes, objects.attributes[:3])
    assert big.captions == objects.captions[:3]
    assert world.generate_multi(2, image_size=224).images.shape == (2, 224, 224, 3)


def test_render_scene_rerenders_one_image_alone(objects: world.SceneSet, multi: world.SceneSet) -> None:
    for i in (0, 17, 39):
        np.testing.assert_array_equal(world.render_scene("objects", int(objects.seeds[i]), 64), objects.images[i])
        np.testing.assert_array_equal(world.render_scene("multi", int(multi.seeds[i]), 64, multi.max_objects), multi.images[i])


def test_pose_and_noise_vary_with_equal_attributes() -> None:
    values = np.array([0, 0, 0, 0, 0, 1, 0])
    a, _, _, cover_a = world._render_object(1, 64, values, need_coverage=True)
    b, _, _, cover_b = world._render_object(2, 64, values, need_coverage=True)
    assert not np.array_equal(cover_a > 0, cover_b > 0)  # the object moved / turned
    background = (cover_a == 0) & (cover_b == 0)
    assert (a[background] != b[background]).mean() > 0.5  # texture and noise differ too


def test_images_are_not_flat(objects: world.SceneSet) -> None:
    # pixel noise and textures: every image has many distinct colours
    assert min(len(np.unique(img.reshape(-1, 3), axis=0)) for img in objects.images) > 500


def test_body_colours_are_distinct_in_pixels() -> None:
    """The mean colour of an object's body pixels is nearest to its own palette entry (colours are learnable).

    Body pixels are found by re-rendering with another body colour: only they change (a lot).
    """
    scenes = world.generate_objects(60, seed=9)
    body_cols = scenes.families["body colour"]
    pattern_cols = scenes.families["pattern"]
    palette = np.array([render.BODY_RGB[v] for v in FAMILIES[1].values], dtype=float)
    checked = 0
    for i in np.flatnonzero(scenes.attributes[:, pattern_cols[0]]):  # solid bodies only
        _, values, _, _ = world._render_object(int(scenes.seeds[i]), 64)
        # render the same object with a body colour swap: the pixels that change are body pixels
        other = values.copy()
        other[1] = (values[1] + 3) % 6
        swapped, _, _, _ = world._render_object(int(scenes.seeds[i]), 64, other)
        interior = np.abs(swapped.astype(int) - scenes.images[i].astype(int)).sum(-1) > 150
        mean = scenes.images[i][interior].reshape(-1, 3).mean(axis=0)
        nearest = int(np.argmin(((palette - mean) ** 2).sum(axis=1)))
        assert scenes.attributes[i, body_cols[nearest]]
        checked += 1
    assert checked >= 5


# ---------------------------------------------------------------------------------------------------------
# captions


def test_object_captions_name_colour_and_shape(objects: world.SceneSet) -> None:
    colour_cols, shape_cols = objects.families["body colour"], objects.families["shape"]
    for caption, row in zip(objects.captions, objects.attributes):
        colour = objects.attribute_names[colour_cols[int(np.argmax(row[colour_cols]))]].split()[0]
        shape = objects.attribute_names[shape_cols[int(np.argmax(row[shape_cols]))]].split()[0]
        words = _words(caption)
        assert colour in words and shape in words, caption
        other_shapes = {objects.attribute_names[c].split()[0] for c in shape_cols} - {shape}
        assert not other_shapes & words, caption
    assert len(set(objects.captions)) == len(objects.captions)
    assert len({c.split(" ")[0] + c.split(" ")[1] for c in objects.captions}) >= 3  # several templates


def test_multi_captions_name_exactly_the_present_categories(multi: world.SceneSet) -> None:
    for caption, row in zip(multi.captions, multi.attributes):
        named = {c for c in CATEGORIES if c in _words(caption)}
        assert named == {CATEGORIES[i] for i in np.flatnonzero(row)}, caption


# ---------------------------------------------------------------------------------------------------------
# splits


def test_split_fractions_and_determinism() -> None:
    codes = assign_split(np.zeros(200), (0.6, 0.2, 0.2), seed=0)
    assert np.bincount(codes, minlength=3).tolist() == [120, 40, 40]
    # cumulative cuts: round(7 * 0.5) = 4 (banker's rounding of 3.5), round(7 * 0.75) = 5
    assert np.bincount(assign_split(np.zeros(7), (0.5, 0.25, 0.25), seed=0), minlength=3).tolist() == [4, 1, 2]
    np.testing.assert_array_equal(codes, assign_split(np.zeros(200), (0.6, 0.2, 0.2), seed=0))
    assert not np.array_equal(codes, assign_split(np.zeros(200), (0.6, 0.2, 0.2), seed=1))
    scenes = world.generate_objects(50, seed=2, split=(0.5, 0.3, 0.2))
    assert np.bincount(scenes.split, minlength=3).tolist() == [25, 15, 10]
    assert set(np.unique(scenes.split).tolist()) <= {0, 1, 2}  # one code per image: the splits are disjoint
    assert not (np.flatnonzero(scenes.split == 0)[:10] == np.arange(10)).all()  # shuffled, not index order


# ---------------------------------------------------------------------------------------------------------
# intervention pairs


def _check_pixels(pairs: world.PairSet) -> None:
    diff = (pairs.before != pairs.after).any(axis=-1)
    assert not (diff & ~pairs.edit_mask).any(), "pixels changed outside edit_mask"
    assert diff.any(axis=(1, 2)).all(), "some pair did not change at all"


def test_object_pairs_flip_exactly_one_family(object_pair_set) -> None:
    scenes, pairs = object_pair_set
    p = 200
    assert pairs.before.shape == pairs.after.shape == (p, 48, 48, 3) and pairs.before.dtype == np.uint8
    assert pairs.edit_mask.shape == (p, 48, 48) and pairs.edit_mask.dtype == bool
    assert pairs.base_index.dtype == np.int64 and pairs.removed.dtype == np.int64 and pairs.added.dtype == np.int64
    assert (scenes.split[pairs.base_index] == 2).all() and len(np.unique(pairs.base_index)) == p
    np.testing.assert_array_equal(pairs.before, scenes.images[pairs.base_index])
    np.testing.assert_array_equal(pairs.before_attributes, scenes.attributes[pairs.base_index])
    rows = np.arange(p)
    flipped = pairs.before_attributes ^ pairs.after_attributes
    np.testing.assert_array_equal(flipped.sum(axis=1), 2)
    assert flipped[rows, pairs.removed].all() and flipped[rows, pairs.added].all()
    assert pairs.before_attributes[rows, pairs.removed].all() and not pairs.after_attributes[rows, pairs.removed].any()
    assert pairs.after_attributes[rows, pairs.added].all() and not pairs.before_attributes[rows, pairs.added].any()
    for j in range(p):
        assert {int(pairs.removed[j]), int(pairs.added[j])} <= set(scenes.families[pairs.family[j]])
    counts = {f.name: pairs.family.count(f.name) for f in FAMILIES}
    assert min(counts.values()) >= p // 7  # every family is edited, balanced
    _check_pixels(pairs)


def test_object_pair_masks_fit_the_edit(object_pair_set) -> None:
    scenes, pairs = object_pair_set
    is_background = np.array([f == "background" for f in pairs.family])
    frac = pairs.edit_mask.mean(axis=(1, 2))
    assert frac[is_background].min() > 0.5 and frac[~is_background].max() < 0.6
    # a background edit leaves every fully covered object pixel untouched, and vice versa
    assert (frac[is_background] < 1.0).all()


def test_multi_pairs_remove_exactly_one_object(multi_pair_set) -> None:
    scenes, pairs = multi_pair_set
    p = 200
    assert pairs.before.shape == (p, 48, 48, 3) and pairs.edit_mask.shape == (p, 48, 48)
    assert pairs.family == ["object"] * p and (pairs.added == -1).all()
    assert (scenes.split[pairs.base_index] == 2).all() and len(np.unique(pairs.base_index)) == p
    np.testing.assert_array_equal(pairs.before, scenes.images[pairs.base_index])
    flipped = pairs.before_attributes ^ pairs.after_attributes
    np.testing.assert_array_equal(flipped.sum(axis=1), 1)
    rows = np.arange(p)
    assert pairs.before_attributes[rows, pairs.removed].all() and not pairs.after_attributes[rows, pairs.removed].any()
    np.testing.assert_array_equal(pairs.after_attributes.sum(axis=1), pairs.before_attributes.sum(axis=1) - 1)
    _check_pixels(pairs)


def test_pairs_at_224_px() -> None:
    scenes = world.generate_objects(3, image_size=224, seed=1, split=(0.0, 0.0, 1.0))
    pairs = world.object_pairs(scenes, 3, seed=0)
    assert pairs.before.shape == (3, 224, 224, 3)
    _check_pixels(pairs)
    multi = world.generate_multi(2, image_size=224, seed=1, split=(0.0, 0.0, 1.0))
    _check_pixels(world.multi_pairs(multi, 2, seed=0))


def test_pairs_are_deterministic_and_may_be_empty(objects: world.SceneSet) -> None:
    n_test = int((objects.split == 2).sum())
    a, b = world.object_pairs(objects, n_test, seed=1), world.object_pairs(objects, n_test, seed=1)
    np.testing.assert_array_equal(a.after, b.after)
    np.testing.assert_array_equal(a.added, b.added)
    empty = world.object_pairs(objects, 0)
    assert empty.before.shape == (0, 64, 64, 3) and empty.family == [] and empty.added.shape == (0,)


def test_pairs_refuse_a_modified_scene_set(objects: world.SceneSet) -> None:
    test_rows = np.flatnonzero(objects.split == 2)
    altered = world.SceneSet(**{**objects.__dict__, "images": objects.images.copy()})
    altered.images[test_rows] = 0
    with pytest.raises(ValueError, match="scenes"):
        world.object_pairs(altered, 1)


# ---------------------------------------------------------------------------------------------------------
# vocabulary and prompts


def test_vocabulary_has_all_phrases_and_distractors(objects: world.SceneSet, multi: world.SceneSet) -> None:
    for scenes in (objects, multi):
        words = vocabulary(scenes.attribute_names)
        assert len(words) == len(set(words))
        assert words[: len(scenes.attribute_names)] == scenes.attribute_names
        assert len(words) - len(scenes.attribute_names) >= 200
    everything = vocabulary()
    assert set(object_attribute_names()) | set(CATEGORIES) <= set(everything)
    assert len(everything) == len(set(everything)) == 34 + len(CATEGORIES) + len(DISTRACTORS)
    assert not set(DISTRACTORS) & (set(object_attribute_names()) | set(CATEGORIES))
    assert len(set(DISTRACTORS)) == len(DISTRACTORS) >= 200


def test_objects_of_every_size_stay_inside_the_frame() -> None:
    # the centre's range is the room the object's unit-frame extent leaves: at the extreme draws (u = 0 or 1) the
    # unrotated extent box still fits the canvas, for every size
    canvas = 192.0
    half_width, above, below = render.OBJECT_EXTENT
    for fraction in render.SIZE_RADIUS.values():
        radius = canvas * fraction
        for ux in (0.0, 1.0):
            for uy in (0.0, 1.0):
                cx, cy = world._object_centre(canvas, radius, ux, uy)
                assert 0 <= cx - half_width * radius and cx + half_width * radius <= canvas
                assert 0 <= cy - above * radius and cy + below * radius <= canvas
    # every unit-frame part lies inside the extent the centre range is computed from
    parts = [render.WING, render.WING * [-1, 1], *render.TOP_PARTS.values(), *render.BODY_SHAPES.values()]
    points = np.concatenate(parts)
    assert np.abs(points[:, 0]).max() <= half_width + 1e-9
    assert -points[:, 1].max() >= -below - 1e-9 and -points[:, 1].min() <= above + 1e-9


def test_zero_shot_prompts_one_per_column(objects: world.SceneSet, multi: world.SceneSet) -> None:
    prompts = zero_shot_prompts(objects.kind)
    assert list(prompts) == list(objects.families)
    for family, columns in objects.families.items():
        assert len(prompts[family]) == len(columns) == len(set(prompts[family]))
    assert prompts["pattern"] == ["a photo of a solid object", "a photo of a striped object", "a photo of a spotted object", "a photo of a checkered object"]
    assert "a photo of an orange object" in prompts["body colour"]
    assert prompts["size"] == ["a photo of a small object", "a photo of a medium-sized object", "a photo of a large object"]
    assert prompts["background"][0] == "a photo of an object on grass"
    multi_prompts = zero_shot_prompts(multi.kind)
    assert list(multi_prompts) == ["object"] and len(multi_prompts["object"]) == len(CATEGORIES)
    assert "a photo of an umbrella" in multi_prompts["object"]


# ---------------------------------------------------------------------------------------------------------
# bad arguments


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"n": 0}, "n"),
        ({"n": 2, "image_size": 31}, "image_size"),
        ({"n": 2, "split": (0.5, 0.5, 0.5)}, "split"),
        ({"n": 2, "split": (0.5, 0.5)}, "split"),
        ({"n": 2, "split": (1.2, -0.1, -0.1)}, "split"),
        ({"n": 2, "seed": -1}, "seed"),
    ],
)
def test_bad_generation_arguments(kwargs, name) -> None:
    for generate in (world.generate_objects, world.generate_multi):
        with pytest.raises(ValueError, match=f"^{name}:"):
            generate(**kwargs)


def test_bad_types_and_pair_arguments(objects: world.SceneSet, multi: world.SceneSet) -> None:
    with pytest.raises(TypeError, match="^n:"):
        world.generate_objects("3")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="^max_objects:"):
        world.generate_multi(2, max_objects=10)
    n_test = int((objects.split == 2).sum())
    with pytest.raises(ValueError, match="^n_pairs:"):
        world.object_pairs(objects, n_test + 1)
    with pytest.raises(ValueError, match="^n_pairs:"):
        world.multi_pairs(multi, -1)
    with pytest.raises(ValueError, match="^scenes:"):
        world.object_pairs(multi, 1)
    with pytest.raises(ValueError, match="^scenes:"):
        world.multi_pairs(objects, 1)
    with pytest.raises(ValueError, match="^kind:"):
        world.render_scene("birds", 0)
