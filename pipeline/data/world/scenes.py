"""The procedural scene world: the offline stand-in for CUB/COCO and the synCUB/synCOCO intervention pairs.

Two kinds of scene, both deterministic from a seed and rendered with PIL/numpy at any square size >= 32:

- **objects** (CUB-like): one object per image, a body with a pattern, a top part and two side wings,
  described by 7 one-hot attribute families (34 binary attributes, names in `vocabulary.FAMILIES`).
  Pose (rotation, position, aspect), colour jitter, background texture and pixel noise vary per image,
  so attributes are not pixel-aligned.
- **multi** (COCO-like): 1..max_objects objects of distinct categories (12 categories) on a 3 x 3 grid of
  slots with jitter, painted back to front (lower objects in front), so neighbours occlude each other
  partly but every object keeps its centre visible. Labels are multi-hot over categories.

Determinism and exact pairs. Image i is rendered from its own seed `seeds[i]` with one generator whose
draws come in a fixed order: first a fixed-length vector of uniforms (attribute values, pose, jitter,
caption choices), then the pixel noise (fixed length), then the background texture (last, because its
number of draws depends on the background kind). An intervention pair re-renders the image from the same
seed with one family's value overridden (objects) or one object left out (multi): every other draw is
identical, so only the edited region changes. `render` explains how that region (`edit_mask`) is computed
exactly. Pairs are drawn from the test split only, one pair per distinct test image.

Rendering loops over images in Python (each image is a handful of PIL calls and small numpy array ops);
there is no per-pixel Python loop.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from pipeline.data.table import assign_split, check_fractions
from pipeline.data.world import render
from pipeline.data.world.texts import N_CAPTION_DRAWS, multi_caption, object_caption
from pipeline.data.world.vocabulary import CATEGORIES, FAMILIES, object_attribute_names, object_family_columns

log = logging.getLogger(__name__)

__all__ = [
    "SceneSet", "PairSet", "generate_objects", "generate_multi", "object_pairs", "multi_pairs", "render_scene", "MAX_SLOTS",
]

KINDS = {"objects": 1, "multi": 2}  # also mixed into the seeds, so the two kinds never share draws
MAX_SLOTS = 9  # the 3 x 3 placement grid of multi-object scenes


@dataclass
class SceneSet:
    """A rendered set of scenes.

    kind: "objects" | "multi". images: uint8 (n, size, size, 3). attributes: bool (n, A).
    attribute_names: A natural phrases usable as text prompts ("red body", "striped pattern", "tree").
    families: family -> attribute columns (one-hot within a family for objects; multi: {"object": all}).
    captions: n captions. split: int8 (n,) 0 train, 1 validation, 2 test. seeds: int64 (n,) per-image
    seed: `render_scene(kind, seeds[i], size, max_objects)` re-renders image i alone.
    max_objects: multi: the most objects per image it was generated with; objects: 1.
    """

    kind: str
    images: np.ndarray
    attributes: np.ndarray
    attribute_names: list[str]
    families: dict[str, list[int]]
    captions: list[str]
    split: np.ndarray
    seeds: np.ndarray
    max_objects: int = 1


@dataclass
class PairSet:
    """Intervention pairs: `after` is `before` with exactly one family changed (or one object removed).

    before, after: uint8 (p, size, size, 3). before_attributes, after_attributes: bool (p, A), differing in
    exactly the `removed` column (on -> off) and the `added` column (off -> on; -1 = none, object removal).
    base_index: int64 (p,) rows of the SceneSet (test split). family: edited family per pair ("object" for
    removals). edit_mask: bool (p, size, size), the pixels allowed to differ; outside it before == after.
    """

    before: np.ndarray
    after: np.ndarray
    before_attributes: np.ndarray
    after_attributes: np.ndarray
    base_index: np.ndarray
    family: list[str]
    removed: np.ndarray
    added: np.ndarray
    edit_mask: np.ndarray


# ---------------------------------------------------------------------------------------------------------
# argument checks


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value}")
    return int(value)


def _check_scenes(scenes: Any, kind: str) -> None:
    if not isinstance(scenes, SceneSet):
        raise TypeError(f"scenes: expected a SceneSet, got {type(scenes).__name__}")
    if scenes.kind != kind:
        raise ValueError(f"scenes: expected kind {kind!r} (from generate_{kind}), got {scenes.kind!r}")
    n = len(scenes.seeds)
    if scenes.images.ndim != 4 or scenes.images.shape[0] != n or scenes.attributes.shape[0] != n or scenes.split.shape != (n,):
        raise ValueError(f"scenes: images, attributes, split and seeds must all have n = {n} rows")


# ---------------------------------------------------------------------------------------------------------
# seeds and splits


def image_seeds(n: int, seed: int, kind: str) -> np.ndarray:
    """int64 (n,) non-negative per-image seeds, derived from (seed, kind)."""
    state = np.random.SeedSequence([seed, KINDS[kind]]).generate_state(n, dtype=np.uint64)
    return (state >> np.uint64(1)).astype(np.int64)


# ---------------------------------------------------------------------------------------------------------
# object scenes

# layout of the per-image uniform vector
_U_FAMILY = 0  # 7 values: one per family
_U_ANGLE, _U_CX, _U_CY, _U_ASPECT = 7, 8, 9, 10
_U_BODY_SHIFT, _U_TOP_SHIFT = 11, 14  # 3 each
_U_COLOUR_GAIN, _U_BRIGHTNESS, _U_SIGMA, _U_PHASE = 17, 18, 19, 20  # phase: 2
_U_CAPTION = 22  # N_CAPTION_DRAWS
_N_U_OBJECT = 32
_FAMILY_SIZES = np.array([len(f.values) for f in FAMILIES])
_FAMILY_STARTS = np.concatenate([[0], np.cumsum(_FAMILY_SIZES)[:-1]])
_BACKGROUND_FAMILY = [f.name for f in FAMILIES].index("background")


ROTATION_DEG = 12.0  # objects turn by up to this many degrees either way
CENTRE_JITTER = 0.9  # fraction of the free room (image minus the object's extent) the centre may move in


def _object_centre(canvas: float, radius: float, ux: float, uy: float) -> tuple[float, float]:
    """Object centre (canvas px): the object's extent box (render.OBJECT_EXTENT) centred, then shifted by
    up to CENTRE_JITTER of the room left on each side, so objects of every size stay inside the image."""
    half_width, above, below = (e * radius for e in render.OBJECT_EXTENT)
    room_x = max(0.0, canvas / 2 - half_width)
    room_y = max(0.0, (canvas - above - below) / 2)
    cx = canvas / 2 + CENTRE_JITTER * room_x * (2 * ux - 1)
    cy = canvas / 2 + (above - below) / 2 + CENTRE_JITTER * room_y * (2 * uy - 1)
    return (cx, cy)


def _object_values(u: np.ndarray) -> np.ndarray:
    """int64 (7,) value index per family from the first 7 uniforms."""
    return np.minimum((u[_U_FAMILY:_U_FAMILY + len(FAMILIES)] * _FAMILY_SIZES).astype(np.int64), _FAMILY_SIZES - 1)


def _noise(rng: np.random.Generator, u: np.ndarray, size: int, sigma_index: int) -> np.ndarray:
    sigma = np.float32(2.0 + 4.0 * u[sigma_index])
    return rng.standard_normal((size, size, 3), dtype=np.float32) * sigma


def _render_object(seed: int, size: int, values: np.ndarray | None = None, need_coverage: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Render one object scene from its seed, optionally with other family values (same other draws).

    Returns image uint8 (S, S, 3), values int64 (7,), uniforms float64 (32,), coverage uint8 (S, S) or None.
    """
    rng = np.random.default_rng(seed)
    u = rng.random(_N_U_OBJECT)
    noise = _noise(rng, u, size, _U_SIGMA)
    values = _object_values(u) if values is None else values
    words = [family.values[v] for family, v in zip(FAMILIES, values)]
    shape, body, top, top_shape, pattern, size_word, bg = words
    back = render.background(bg, size, rng)
    factor = render.supersampling(size)
    canvas = size * factor
    gain = 0.9 + 0.2 * u[_U_COLOUR_GAIN]
    radius = canvas * render.SIZE_RADIUS[size_word]
    look = render.ObjectLook(
        shape=shape,
        body=render.jitter_colour(render.BODY_RGB[body], gain, (u[_U_BODY_SHIFT:_U_BODY_SHIFT + 3] - 0.5) * 24),
        top=render.jitter_colour(render.TOP_RGB[top], gain, (u[_U_TOP_SHIFT:_U_TOP_SHIFT + 3] - 0.5) * 24),
        top_shape=top_shape,
        pattern=pattern,
        centre=_object_centre(canvas, radius, u[_U_CX], u[_U_CY]),
        radius=radius,
        angle=math.radians(ROTATION_DEG * (2 * u[_U_ANGLE] - 1)),
        aspect=0.95 + 0.1 * u[_U_ASPECT],
        pattern_phase=(float(u[_U_PHASE]), float(u[_U_PHASE + 1])),
    )
    strokes = render.object_strokes(look, factor)
    image = render.compose(back, strokes, factor, 0.9 + 0.2 * u[_U_BRIGHTNESS], noise)
    cover = render.coverage(strokes, size, factor) if need_coverage else None
    return image, values, u, cover


def generate_objects(n: int, image_size: int = 64, seed: int = 0, split: tuple[float, float, float] = (0.8, 0.1, 0.1)) -> SceneSet:
    """Render n object scenes (CUB-like): 7 one-hot families, 34 attributes, captions, a deterministic split."""
    n = _check_int("n", n, 1)
    image_size = _check_int("image_size", image_size, 32)
    seed = _check_int("seed", seed, 0)
    fractions = check_fractions(split)
    seeds = image_seeds(n, seed, "objects")
    images = np.empty((n, image_size, image_size, 3), dtype=np.uint8)
    attributes = np.zeros((n, int(_FAMILY_SIZES.sum())), dtype=bool)
    captions = []
    for i, image_seed in enumerate(seeds):
        images[i], values, u, _ = _render_object(int(image_seed), image_size)
        attributes[i, _FAMILY_STARTS + values] = True
        words = {family.name: family.values[v] for family, v in zip(FAMILIES, values)}
        captions.append(object_caption(words, u[_U_CAPTION:_U_CAPTION + N_CAPTION_DRAWS]))
    log.debug("rendered %d object scenes at %d px", n, image_size)
    return SceneSet("objects", images, attributes, object_attribute_names(), object_family_columns(), captions,
                    assign_split(np.zeros(n), fractions, seed), seeds, max_objects=1)


def object_pairs(scenes: SceneSet, n_pairs: int, seed: int = 0) -> PairSet:
    """One-attribute edits of n_pairs distinct test images: one family old -> new value, nothing else.

    Families are balanced (each edited about n_pairs / 7 times); the new value is uniform among the others.
    edit_mask: background edits -> pixels not fully covered by the object; other edits -> pixels touched
    by the object before or after the edit.
    """
    _check_scenes(scenes, "objects")
    n_pairs = _check_int("n_pairs", n_pairs, 0)
    seed = _check_int("seed", seed, 0)
    bases, rng = _pair_bases(scenes, n_pairs, seed)
    size = scenes.images.shape[1]
    family_index = rng.permutation(np.resize(np.arange(len(FAMILIES)), n_pairs))
    steps = rng.random(n_pairs)
    out = _empty_pairs(n_pairs, size, scenes.attributes.shape[1])
    for j, (base, f) in enumerate(zip(bases, family_index)):
        before, values, _, cover_before = _render_object(int(scenes.seeds[base]), size, need_coverage=True)
        _check_rerender(scenes, base, before)
        k = _FAMILY_SIZES[f]
        new_values = values.copy()
        new_values[f] = (values[f] + 1 + min(int(steps[j] * (k - 1)), k - 2)) % k
        after, _, _, cover_after = _render_object(int(scenes.seeds[base]), size, new_values, need_coverage=True)
        assert cover_before is not None and cover_after is not None
        if f == _BACKGROUND_FAMILY:
            out.edit_mask[j] = cover_before < 255
        else:
            out.edit_mask[j] = (cover_before > 0) | (cover_after > 0)
        out.before[j], out.after[j] = before, after
        out.removed[j] = _FAMILY_STARTS[f] + values[f]
        out.added[j] = _FAMILY_STARTS[f] + new_values[f]
        out.family.append(FAMILIES[f].name)
    return _finish_pairs(out, scenes, bases)


# ---------------------------------------------------------------------------------------------------------
# multi-object scenes

_M_COUNT, _M_BACKGROUND, _M_BRIGHTNESS, _M_SIGMA = 0, 1, 2, 3
_M_CATEGORY = 4  # len(CATEGORIES) sort keys
_M_SLOT = _M_CATEGORY + len(CATEGORIES)  # MAX_SLOTS sort keys
_M_CAPTION = _M_SLOT + MAX_SLOTS  # N_CAPTION_DRAWS
_M_OBJECT = _M_CAPTION + N_CAPTION_DRAWS  # per object: radius, dx, dy, angle, gain, shift (3)
_M_PER_OBJECT = 8
_N_U_MULTI = _M_OBJECT + _M_PER_OBJECT * MAX_SLOTS
_MULTI_BACKGROUNDS = FAMILIES[_BACKGROUND_FAMILY].values


def _render_multi(seed: int, size: int, max_objects: int, n_objects: int | None = None, drop: int | None = None,
                  need_coverage: bool = False) -> tuple[np.ndarray, list[int], np.ndarray, np.ndarray | None]:
    """Render one multi-object scene, leaving out category `drop` if given.

    The object count is 1 + floor(u0 * max_objects) unless `n_objects` forces it (pairs know it from the
    labels).

    Returns image uint8 (S, S, 3), the category indices present (sampling order, before any drop),
    uniforms float64, and the coverage uint8 (S, S) of the dropped object (None unless need_coverage).
    """
    rng = np.random.default_rng(seed)
    u = rng.random(_N_U_MULTI)
    noise = _noise(rng, u, size, _M_SIGMA)
    if n_objects is None:
        n_objects = _n_objects(u[_M_COUNT], max_objects)
    bg = _MULTI_BACKGROUNDS[min(int(u[_M_BACKGROUND] * len(_MULTI_BACKGROUNDS)), len(_MULTI_BACKGROUNDS) - 1)]
    back = render.background(bg, size, rng)
    categories = [int(c) for c in np.argsort(u[_M_CATEGORY:_M_CATEGORY + len(CATEGORIES)], kind="stable")[:n_objects]]
    slots = np.argsort(u[_M_SLOT:_M_SLOT + MAX_SLOTS], kind="stable")[:n_objects]
    factor = render.supersampling(size)
    cell = size * factor / 3.0
    placed = []
    for j, (category, slot) in enumerate(zip(categories, slots)):
        v = u[_M_OBJECT + _M_PER_OBJECT * j:_M_OBJECT + _M_PER_OBJECT * (j + 1)]
        centre = (cell * (slot % 3 + 0.5 + 0.24 * (v[1] - 0.5)), cell * (slot // 3 + 0.5 + 0.24 * (v[2] - 0.5)))
        strokes = render.category_strokes(CATEGORIES[category], centre, cell * (0.5 + 0.2 * v[0]), math.radians(12.0 * (2 * v[3] - 1)),
                                          0.88 + 0.24 * v[4], (v[5:8] - 0.5) * 16, factor)
        placed.append((centre[1], j, category, strokes))
    placed.sort(key=lambda item: (item[0], item[1]))  # back to front: lower in the image = nearer
    strokes_all = [s for _, _, category, strokes in placed if category != drop for s in strokes]
    image = render.compose(back, strokes_all, factor, 0.9 + 0.2 * u[_M_BRIGHTNESS], noise)
    cover = None
    if need_coverage and drop is not None:
        cover = render.coverage([s for _, _, category, strokes in placed if category == drop for s in strokes], size, factor)
    return image, categories, u, cover


def _n_objects(u0: float, max_objects: int) -> int:
    return 1 + min(int(u0 * max_objects), max_objects - 1)


def generate_multi(n: int, image_size: int = 64, seed: int = 0, split: tuple[float, float, float] = (0.8, 0.1, 0.1), max_objects: int = 5) -> SceneSet:
    """Render n multi-object scenes (COCO-like): 1..max_objects distinct categories of 12, multi-hot labels."""
    n = _check_int("n", n, 1)
    image_size = _check_int("image_size", image_size, 32)
    seed = _check_int("seed", seed, 0)
    fractions = check_fractions(split)
    max_objects = _check_int("max_objects", max_objects, 1)
    if max_objects > MAX_SLOTS:
        raise ValueError(f"max_objects: expected at most {MAX_SLOTS} (the 3 x 3 placement grid), got {max_objects}")
    seeds = image_seeds(n, seed, "multi")
    images = np.empty((n, image_size, image_size, 3), dtype=np.uint8)
    attributes = np.zeros((n, len(CATEGORIES)), dtype=bool)
    captions = []
    for i, image_seed in enumerate(seeds):
        images[i], categories, u, _ = _render_multi(int(image_seed), image_size, max_objects)
        attributes[i, categories] = True
        bg = _MULTI_BACKGROUNDS[min(int(u[_M_BACKGROUND] * len(_MULTI_BACKGROUNDS)), len(_MULTI_BACKGROUNDS) - 1)]
        captions.append(multi_caption([CATEGORIES[c] for c in categories], bg, u[_M_CAPTION:_M_CAPTION + N_CAPTION_DRAWS]))
    log.debug("rendered %d multi-object scenes at %d px", n, image_size)
    return SceneSet("multi", images, attributes, list(CATEGORIES), {"object": list(range(len(CATEGORIES)))}, captions,
                    assign_split(np.zeros(n), fractions, seed), seeds, max_objects=max_objects)


def multi_pairs(scenes: SceneSet, n_pairs: int, seed: int = 0) -> PairSet:
    """Object removals from n_pairs distinct test images: one present object (uniform) left out, the rest kept.

    edit_mask: the pixels the removed object touched (including where it hid other objects).
    """
    _check_scenes(scenes, "multi")
    n_pairs = _check_int("n_pairs", n_pairs, 0)
    seed = _check_int("seed", seed, 0)
    bases, rng = _pair_bases(scenes, n_pairs, seed)
    size = scenes.images.shape[1]
    picks = rng.random(n_pairs)
    out = _empty_pairs(n_pairs, size, scenes.attributes.shape[1])
    for j, base in enumerate(bases):
        present = np.flatnonzero(scenes.attributes[base])
        if len(present) == 0:
            raise ValueError(f"scenes: image {base} has no objects; was it produced by generate_multi?")
        drop = int(present[min(int(picks[j] * len(present)), len(present) - 1)])
        image_seed = int(scenes.seeds[base])
        before, _, _, _ = _render_multi(image_seed, size, scenes.max_objects, len(present))
        _check_rerender(scenes, base, before)
        after, _, _, cover = _render_multi(image_seed, size, scenes.max_objects, len(present), drop=drop, need_coverage=True)
        assert cover is not None
        out.before[j], out.after[j], out.edit_mask[j] = before, after, cover > 0
        out.removed[j], out.added[j] = drop, -1
        out.family.append("object")
    return _finish_pairs(out, scenes, bases)


# ---------------------------------------------------------------------------------------------------------
# shared pair helpers


def _pair_bases(scenes: SceneSet, n_pairs: int, seed: int) -> tuple[np.ndarray, np.random.Generator]:
    """n_pairs distinct test rows (ascending) and the generator for the pairs' own draws."""
    test = np.flatnonzero(scenes.split == 2)
    if n_pairs > len(test):
        raise ValueError(f"n_pairs: expected at most the {len(test)} test images (one pair per image), got {n_pairs}")
    rng = np.random.default_rng([seed, KINDS[scenes.kind], 0xFA12])
    return np.sort(rng.choice(test, size=n_pairs, replace=False)).astype(np.int64), rng


def _empty_pairs(n_pairs: int, size: int, n_attributes: int) -> PairSet:
    return PairSet(
        before=np.empty((n_pairs, size, size, 3), dtype=np.uint8),
        after=np.empty((n_pairs, size, size, 3), dtype=np.uint8),
        before_attributes=np.zeros((n_pairs, n_attributes), dtype=bool),
        after_attributes=np.zeros((n_pairs, n_attributes), dtype=bool),
        base_index=np.zeros(n_pairs, dtype=np.int64),
        family=[],
        removed=np.zeros(n_pairs, dtype=np.int64),
        added=np.full(n_pairs, -1, dtype=np.int64),
        edit_mask=np.zeros((n_pairs, size, size), dtype=bool),
    )


def _finish_pairs(out: PairSet, scenes: SceneSet, bases: np.ndarray) -> PairSet:
    """Fill base indices and labels: after = before with `removed` off and `added` (if any) on."""
    out.base_index[:] = bases
    out.before_attributes[:] = scenes.attributes[bases]
    out.after_attributes[:] = scenes.attributes[bases]
    rows = np.arange(len(bases))
    out.after_attributes[rows, out.removed] = False
    has_added = out.added >= 0
    out.after_attributes[rows[has_added], out.added[has_added]] = True
    return out


def _check_rerender(scenes: SceneSet, base: int, image: np.ndarray) -> None:
    if not np.array_equal(scenes.images[base], image):
        raise ValueError(f"scenes: image {base} does not re-render from its seed; pairs need the SceneSet exactly as generated")


def render_scene(kind: str, seed: int, image_size: int = 64, max_objects: int = 5) -> np.ndarray:
    """Re-render one image uint8 (S, S, 3) from its per-image seed (`SceneSet.seeds[i]`), alone."""
    image_size = _check_int("image_size", image_size, 32)
    seed = _check_int("seed", seed, 0)
    if kind == "objects":
        return _render_object(seed, image_size)[0]
    if kind == "multi":
        max_objects = _check_int("max_objects", max_objects, 1)
        return _render_multi(seed, image_size, max_objects)[0]
    raise ValueError(f"kind: expected 'objects' or 'multi', got {kind!r}")


def contact_sheet(images: np.ndarray, columns: int = 8) -> Image.Image:
    """Tile uint8 (n, S, S, 3) images into one PIL image (for looking at the world; writes nothing)."""
    n, size = images.shape[0], images.shape[1]
    rows = -(-n // columns)
    sheet = np.zeros((rows * size, columns * size, 3), dtype=np.uint8)
    for i in range(n):
        r, c = divmod(i, columns)
        sheet[r * size:(r + 1) * size, c * size:(c + 1) * size] = images[i]
    return Image.fromarray(sheet)
