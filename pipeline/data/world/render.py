"""Drawing the procedural scenes: backgrounds (numpy), shapes (PIL on a supersampled canvas), noise.

How an image is made, and why it makes exact intervention pairs possible:

1. A background texture is generated at the target size S (numpy) and enlarged by an integer factor f
   (nearest neighbour) into a canvas of C = f * S pixels.
2. Strokes (filled polygons with an outline, patterned polygons, thick lines) are painted on the canvas in
   painter's order with hard (binary) edges.
3. The canvas is reduced by f (box average: anti-aliasing) and multiplied by a brightness factor; Gaussian
   pixel noise is added and the result rounded to uint8.

Every step is pixel-local after (1), so two renders that share the background, the noise and the
brightness differ only at target pixels whose f x f block was painted differently. The same strokes
painted as 255 on a black "L" canvas and reduced give the *coverage*: 255 where every sub-pixel is
covered, 0 where none is. That is how the pair code knows exactly which pixels may differ.

Coordinates: canvas pixels, x right, y down. Shapes are defined in a unit frame (extent about [-1, 1])
and placed with `place` (scale, aspect, rotation, translation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

RGB = tuple[int, int, int]
OUTLINE: RGB = (28, 28, 28)


@dataclass(frozen=True)
class Pattern:
    """A periodic fill in the object's rotated frame, in canvas pixels.

    kind: "striped" | "spotted" | "checkered". centre: (x, y) origin of the frame. angle: radians.
    period: pixels per repeat. phase: (2,) offsets in periods, so patterns do not align with the object.
    """

    kind: str
    centre: tuple[float, float]
    angle: float
    period: float
    phase: tuple[float, float]


@dataclass(frozen=True)
class Stroke:
    """One painting operation.

    points: float (m, 2) canvas coordinates. width: 0 = filled polygon, > 0 = polyline of that width (px).
    outline: paint a dark outline of `outline_width` px around a filled polygon (None = no outline);
    with `fill=False` only the outline is painted. pattern: fill only where the pattern is "on".
    """

    points: np.ndarray
    colour: RGB
    width: int = 0
    outline: RGB | None = None
    outline_width: int = 1
    fill: bool = True
    pattern: Pattern | None = None


def supersampling(size: int) -> int:
    """Canvas factor f for target size S: the canvas is at least 192 px and at least 2x (anti-aliasing).

    3 x 3 sub-pixels at 64 px already give smooth edges; more costs time in the pattern fill.
    """
    return max(2, math.ceil(192 / size))


# ---------------------------------------------------------------------------------------------------------
# unit-frame geometry


def regular_polygon(n: int, radius: float = 1.0, start_deg: float = -90.0, centre: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
    """(n, 2) vertices of a regular n-gon; start_deg = angle of the first vertex (-90 = pointing up)."""
    angles = np.deg2rad(start_deg + 360.0 * np.arange(n) / n)
    return np.stack([centre[0] + radius * np.cos(angles), centre[1] + radius * np.sin(angles)], axis=1)


def ellipse(rx: float, ry: float, centre: tuple[float, float] = (0.0, 0.0), n: int = 36) -> np.ndarray:
    """(n, 2) polygon approximating an axis-aligned ellipse (rotates with the shape, unlike PIL's ellipse)."""
    angles = 2 * np.pi * np.arange(n) / n
    return np.stack([centre[0] + rx * np.cos(angles), centre[1] + ry * np.sin(angles)], axis=1)


def arc(radius: float, start_deg: float, end_deg: float, centre: tuple[float, float] = (0.0, 0.0), n: int = 16) -> np.ndarray:
    """(n, 2) points along a circular arc (for polylines and half discs)."""
    angles = np.deg2rad(np.linspace(start_deg, end_deg, n))
    return np.stack([centre[0] + radius * np.cos(angles), centre[1] + radius * np.sin(angles)], axis=1)


def rect(x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
    """(4, 2) corners of an axis-aligned rectangle."""
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=np.float64)


def star(tips: int = 5, outer: float = 1.2, inner: float = 0.5) -> np.ndarray:
    """(2 * tips, 2) star polygon, one tip pointing up."""
    angles = np.deg2rad(-90.0 + 180.0 * np.arange(2 * tips) / tips)
    radii = np.where(np.arange(2 * tips) % 2 == 0, outer, inner)
    return np.stack([radii * np.cos(angles), radii * np.sin(angles)], axis=1)


def cross(arm: float = 1.05, half_width: float = 0.38) -> np.ndarray:
    """(12, 2) plus-sign polygon."""
    a, w = arm, half_width
    return np.array([[-w, -a], [w, -a], [w, -w], [a, -w], [a, w], [w, w], [w, a], [-w, a], [-w, w], [-a, w], [-a, -w], [-w, -w]])


def place(points: np.ndarray, centre: tuple[float, float], scale: float, angle: float = 0.0, aspect: float = 1.0) -> np.ndarray:
    """Unit-frame points (m, 2) -> canvas points: stretch x by aspect (y by 1/aspect), rotate, scale, shift."""
    x = points[:, 0] * aspect
    y = points[:, 1] / aspect
    c, s = math.cos(angle), math.sin(angle)
    return np.stack([centre[0] + scale * (c * x - s * y), centre[1] + scale * (s * x + c * y)], axis=1)


def jitter_colour(colour: RGB, brightness: float, shift: np.ndarray) -> RGB:
    """colour * brightness + shift (3,), clipped to 0..255 integers."""
    values = np.clip(np.asarray(colour, dtype=np.float64) * brightness + shift, 0, 255)
    return (int(round(values[0])), int(round(values[1])), int(round(values[2])))


def darker(colour: RGB, factor: float) -> RGB:
    """colour scaled towards black (factor 0..1 = fraction kept)."""
    return (int(colour[0] * factor), int(colour[1] * factor), int(colour[2] * factor))


# ---------------------------------------------------------------------------------------------------------
# painting


def _pattern_on(pattern: Pattern, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Boolean pattern at canvas pixel centres x float32 (1, w), y float32 (h, 1) -> (h, w) (float32: speed)."""
    c, s = math.cos(pattern.angle) / pattern.period, math.sin(pattern.angle) / pattern.period
    dx, dy = x + np.float32(0.5 - pattern.centre[0]), y + np.float32(0.5 - pattern.centre[1])
    u = np.float32(c) * dx + (np.float32(s) * dy + np.float32(pattern.phase[0]))
    if pattern.kind == "striped":
        return (u % 1.0) < 0.5
    v = np.float32(-s) * dx + (np.float32(c) * dy + np.float32(pattern.phase[1]))
    if pattern.kind == "spotted":
        return ((u % 1.0) - 0.5) ** 2 + ((v % 1.0) - 0.5) ** 2 < 0.3**2
    if pattern.kind == "checkered":
        return (np.floor(u) + np.floor(v)) % 2 == 0
    raise ValueError(f"pattern.kind: expected 'striped', 'spotted' or 'checkered', got {pattern.kind!r}")


def _paint_pattern(image: Image.Image, stroke: Stroke, colour: int | RGB) -> None:
    """Paint `colour` where the pattern is on, inside the stroke's polygon (computed on its bounding box only)."""
    assert stroke.pattern is not None
    width, height = image.size
    x0 = max(int(math.floor(stroke.points[:, 0].min())) - 1, 0)
    y0 = max(int(math.floor(stroke.points[:, 1].min())) - 1, 0)
    x1 = min(int(math.ceil(stroke.points[:, 0].max())) + 2, width)
    y1 = min(int(math.ceil(stroke.points[:, 1].max())) + 2, height)
    if x1 <= x0 or y1 <= y0:
        return
    inside = Image.new("L", (x1 - x0, y1 - y0), 0)
    ImageDraw.Draw(inside).polygon((stroke.points - np.array([x0, y0])).ravel().tolist(), fill=255)
    on = _pattern_on(stroke.pattern, np.arange(x0, x1, dtype=np.float32)[None, :], np.arange(y0, y1, dtype=np.float32)[:, None])
    mask = np.asarray(inside) & np.where(on, 255, 0).astype(np.uint8)
    image.paste(colour, (x0, y0, x1, y1), Image.fromarray(mask, mode="L"))


def paint(image: Image.Image, strokes: list[Stroke], coverage: bool = False) -> None:
    """Paint strokes in order onto an RGB canvas, or (coverage=True) their footprint as 255 onto an "L" canvas.

    Both modes rasterise identical geometry, so the coverage is exactly the set of canvas pixels the
    strokes can change.
    """
    draw = ImageDraw.Draw(image)
    for stroke in strokes:
        colour: int | RGB = 255 if coverage else stroke.colour
        outline: int | RGB | None = None if stroke.outline is None else (255 if coverage else stroke.outline)
        xy = stroke.points.ravel().tolist()
        if stroke.width > 0:
            draw.line(xy, fill=colour, width=stroke.width, joint="curve")
        elif stroke.pattern is not None:
            _paint_pattern(image, stroke, colour)
        else:
            draw.polygon(xy, fill=colour if stroke.fill else None, outline=outline, width=stroke.outline_width)


def compose(background: np.ndarray, strokes: list[Stroke], factor: int, brightness: float, noise: np.ndarray) -> np.ndarray:
    """Background uint8 (S, S, 3) + strokes on the f-times canvas -> reduce -> brightness, noise -> uint8 (S, S, 3).

    noise: float32 (S, S, 3), already scaled to grey levels.
    """
    size = background.shape[0]
    canvas = Image.fromarray(background, mode="RGB").resize((size * factor, size * factor), Image.Resampling.NEAREST)
    paint(canvas, strokes)
    small = np.asarray(canvas.reduce(factor), dtype=np.float32)
    return np.clip(np.rint(small * np.float32(brightness) + noise), 0, 255).astype(np.uint8)


def coverage(strokes: list[Stroke], size: int, factor: int) -> np.ndarray:
    """uint8 (S, S) fraction of each target pixel the strokes cover, 0..255 (255 = every sub-pixel)."""
    canvas = Image.new("L", (size * factor, size * factor), 0)
    paint(canvas, strokes, coverage=True)
    return np.asarray(canvas.reduce(factor))


# ---------------------------------------------------------------------------------------------------------
# backgrounds (target resolution, numpy): each draws from `rng` only, so equal rng state -> equal texture


def _upsample(grid: np.ndarray, size: int) -> np.ndarray:
    """Smoothly enlarge a small float32 grid (h, w) to (size, size) (bilinear)."""
    return np.asarray(Image.fromarray(grid.astype(np.float32), mode="F").resize((size, size), Image.Resampling.BILINEAR))


def _grass(size: int, rng: np.random.Generator) -> np.ndarray:
    rows = np.linspace(0.0, 1.0, size, dtype=np.float32)[:, None, None]
    base = np.array([60, 135, 45], np.float32) * (0.85 + 0.3 * rows)
    blades = np.repeat(rng.standard_normal((size // 4 + 1, size), dtype=np.float32), 4, axis=0)[:size]
    fine = rng.standard_normal((size, size), dtype=np.float32)
    return base + (14 * blades + 6 * fine)[:, :, None] * np.array([0.6, 1.0, 0.5], np.float32)


def _sky(size: int, rng: np.random.Generator) -> np.ndarray:
    rows = np.linspace(0.0, 1.0, size, dtype=np.float32)[:, None, None]
    base = np.array([85, 145, 230], np.float32) * (1 - rows) + np.array([170, 205, 245], np.float32) * rows
    clouds = np.clip((_upsample(rng.random((5, 5), dtype=np.float32), size) - 0.55) * 3.0, 0.0, 1.0)[:, :, None]
    return base * (1 - clouds) + np.float32(245) * clouds


def _sand(size: int, rng: np.random.Generator) -> np.ndarray:
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    phase, freq = rng.random(2, dtype=np.float32)
    dunes = np.sin(2 * np.pi * ((3 + 2 * freq) * y + 0.25 * np.sin(2 * np.pi * (x + phase))))
    speckle = rng.standard_normal((size, size), dtype=np.float32)
    return np.array([222, 192, 132], np.float32) + (10 * dunes + 9 * speckle)[:, :, None]


def _snow(size: int, rng: np.random.Generator) -> np.ndarray:
    rows = np.linspace(0.0, 1.0, size, dtype=np.float32)[:, None, None]
    base = np.array([226, 233, 245], np.float32) + 14 * rows
    drifts = _upsample(rng.standard_normal((4, 4), dtype=np.float32), size)
    speckle = rng.standard_normal((size, size), dtype=np.float32)
    return base + (5 * drifts + 4 * speckle)[:, :, None] * np.array([1.0, 1.0, 0.6], np.float32)


def _night(size: int, rng: np.random.Generator) -> np.ndarray:
    rows = np.linspace(0.0, 1.0, size, dtype=np.float32)[:, None, None]
    base = np.array([12, 16, 48], np.float32) + np.array([18, 18, 30], np.float32) * rows
    stars = (rng.random((size, size), dtype=np.float32) > 0.985)[:, :, None]
    return np.where(stars, np.array([245, 240, 200], np.float32), base)


def _wood(size: int, rng: np.random.Generator) -> np.ndarray:
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    n_planks = 5
    shade = rng.normal(0.0, 12.0, n_planks).astype(np.float32)
    phase = rng.random(n_planks, dtype=np.float32)
    plank = np.minimum((x * n_planks).astype(np.int64), n_planks - 1)
    grain = np.sin(2 * np.pi * (9 * y + 0.3 * np.sin(2 * np.pi * (4 * x + phase[plank]))))
    gap = ((x * n_planks) % 1.0) < (1.2 / size * n_planks)
    value = np.array([150, 98, 55], np.float32) + (shade[plank] + 9 * grain)[:, :, None]
    return np.where(gap[:, :, None], np.array([70, 45, 25], np.float32), value)


BACKGROUND_PAINTERS = {"grass": _grass, "sky": _sky, "sand": _sand, "snow": _snow, "night": _night, "wood": _wood}


def background(kind: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 (size, size, 3) texture of a named background, drawn from `rng`."""
    if kind not in BACKGROUND_PAINTERS:
        raise ValueError(f"kind: expected one of {sorted(BACKGROUND_PAINTERS)}, got {kind!r}")
    return np.clip(np.rint(BACKGROUND_PAINTERS[kind](size, rng)), 0, 255).astype(np.uint8)


# ---------------------------------------------------------------------------------------------------------
# object scenes: a body with a pattern, a top part and two side wings (the wings share the top's colour)
#
# What the layout is for: at 64 px a body is 20-35 px across, so its shape is told by a few corners and
# edges. The top part and the wings are painted *behind* the body (a complete outlined silhouette in front
# of them), the pattern is painted inside an inset copy of the body (a solid rim keeps the outline against
# the body colour, not against dark pattern pieces), and the top part sits above the body rather than over
# its upper corners (apex of the triangle, top tip of the star, flat top of the hexagon).

BODY_SHAPES: dict[str, np.ndarray] = {
    "circle": regular_polygon(40, 1.0),
    "square": rect(-0.87, -0.87, 0.87, 0.87),
    "triangle": regular_polygon(3, 1.25, -90.0, centre=(0.0, 0.05)),
    "hexagon": regular_polygon(6, 1.02, 0.0),  # flat top and bottom: reads apart from the circle at 64 px
    "star": star(5, 1.25, 0.52),
    "cross": cross(1.05, 0.38),
}
TOP_PARTS: dict[str, np.ndarray] = {  # silhouettes kept far apart: disc, tall spike, wide slab; base hidden behind the body
    "round": ellipse(0.42, 0.42, centre=(0.0, -1.28), n=24),
    "pointed": np.array([[-0.42, -0.75], [0.42, -0.75], [0.0, -1.85]]),
    "flat": rect(-0.8, -1.3, 0.8, -0.75),
}
WING = np.array([[-0.3, -0.15], [-1.3, 0.0], [-1.2, 0.3], [-0.3, 0.4]])
OBJECT_EXTENT = (1.3, 1.85, 1.05)  # unit-frame half width (wings), height above and depth below the centre
BODY_RGB: dict[str, RGB] = {
    "red": (215, 38, 38), "green": (40, 165, 60), "blue": (40, 80, 220),
    "yellow": (238, 212, 40), "purple": (140, 55, 190), "orange": (248, 135, 25),
}
TOP_RGB: dict[str, RGB] = {
    "white": (246, 246, 246), "black": (22, 22, 22), "cyan": (40, 212, 222),
    "pink": (250, 150, 200), "brown": (120, 72, 36), "gray": (135, 135, 135),
}
SIZE_RADIUS = {"small": 0.18, "medium": 0.235, "large": 0.29}  # body radius as a fraction of the image side
PATTERN_PERIOD = {"striped": 0.55, "spotted": 0.62, "checkered": 0.5}  # in body radii: visible at 64 px
PATTERN_INSET = 0.72  # the pattern fills the body scaled by this about its centre: a solid rim shows the outline
PATTERN_SHADE = 0.35  # pattern colour = body colour scaled towards black by this


@dataclass(frozen=True)
class ObjectLook:
    """Everything that fixes an object's strokes. centre, radius: canvas px; angle: radians; colours jittered."""

    shape: str
    body: RGB
    top: RGB
    top_shape: str
    pattern: str
    centre: tuple[float, float]
    radius: float
    angle: float
    aspect: float
    pattern_phase: tuple[float, float]


def object_strokes(look: ObjectLook, factor: int) -> list[Stroke]:
    """Painter's order: wings, top part, body (outlined), pattern inside the inset body. Outlines are one target pixel wide."""
    def put(points: np.ndarray) -> np.ndarray:
        return place(points, look.centre, look.radius, look.angle, look.aspect)

    unit_body = BODY_SHAPES[look.shape]
    strokes = [
        Stroke(put(WING), look.top, outline=OUTLINE, outline_width=factor),
        Stroke(put(WING * np.array([-1.0, 1.0])), look.top, outline=OUTLINE, outline_width=factor),
        Stroke(put(TOP_PARTS[look.top_shape]), look.top, outline=OUTLINE, outline_width=factor),
        Stroke(put(unit_body), look.body, outline=OUTLINE, outline_width=factor),
    ]
    if look.pattern != "solid":
        pattern = Pattern(look.pattern, look.centre, look.angle, PATTERN_PERIOD[look.pattern] * look.radius, look.pattern_phase)
        strokes.append(Stroke(put(unit_body * PATTERN_INSET), darker(look.body, PATTERN_SHADE), pattern=pattern))
    return strokes


# ---------------------------------------------------------------------------------------------------------
# multi-object scenes: each category is a few parts in a unit frame, with its own colours


@dataclass(frozen=True)
class Part:
    """A piece of a category drawing: unit-frame points, colour, line width in radii (0 = filled), outline."""

    points: np.ndarray
    colour: RGB
    width: float = 0.0
    outlined: bool = True


def _half_disc(radius: float, centre: tuple[float, float]) -> np.ndarray:
    return arc(radius, 180.0, 360.0, centre, n=20)


CATEGORY_PARTS: dict[str, tuple[Part, ...]] = {
    "ball": (
        Part(regular_polygon(36, 0.8), (215, 45, 45)),
        Part(arc(0.8, 200.0, 340.0, (0.0, 0.55), n=12), (250, 235, 235), width=0.14, outlined=False),
        Part(ellipse(0.16, 0.16, (-0.35, -0.35), n=12), (255, 225, 225), outlined=False),
    ),
    "box": (
        Part(rect(-0.8, -0.7, 0.8, 0.8), (178, 122, 66)),
        Part(rect(-0.8, -0.7, 0.8, -0.42), (140, 92, 48)),
        Part(rect(-0.13, -0.7, 0.13, 0.8), (228, 205, 145), outlined=False),
    ),
    "tree": (
        Part(rect(-0.16, 0.15, 0.16, 1.0), (110, 68, 34)),
        Part(regular_polygon(28, 0.68, centre=(0.0, -0.3)), (35, 128, 45)),
    ),
    "house": (
        Part(rect(-0.7, -0.15, 0.7, 0.9), (232, 214, 168)),
        Part(np.array([[-0.92, -0.1], [0.0, -0.95], [0.92, -0.1]]), (176, 50, 40)),
        Part(rect(-0.16, 0.35, 0.16, 0.9), (110, 68, 34)),
        Part(rect(0.3, 0.08, 0.56, 0.34), (150, 200, 240)),
    ),
    "car": (
        Part(np.array([[-1.0, 0.05], [-1.0, 0.5], [1.0, 0.5], [1.0, 0.05], [0.55, 0.0], [0.35, -0.38], [-0.45, -0.38], [-0.68, 0.0]]), (45, 85, 205)),
        Part(np.array([[-0.36, -0.28], [-0.56, 0.0], [0.45, 0.0], [0.28, -0.28]]), (190, 222, 246), outlined=False),
        Part(regular_polygon(16, 0.23, centre=(-0.55, 0.52)), (30, 30, 30)),
        Part(regular_polygon(16, 0.23, centre=(0.55, 0.52)), (30, 30, 30)),
    ),
    "flower": (
        Part(np.array([[0.0, 0.05], [0.0, 1.0]]), (50, 150, 50), width=0.13),
        Part(ellipse(0.28, 0.12, (0.25, 0.6), n=14), (50, 150, 50)),
        *(Part(regular_polygon(14, 0.27, centre=(0.42 * math.cos(a), -0.3 + 0.42 * math.sin(a))), (236, 92, 176)) for a in np.linspace(0, 2 * np.pi, 6, endpoint=False)),
        Part(regular_polygon(14, 0.22, centre=(0.0, -0.3)), (246, 212, 50)),
    ),
    "fish": (
        Part(np.array([[0.5, 0.0], [1.0, -0.48], [1.0, 0.48]]), (240, 120, 30)),
        Part(ellipse(0.75, 0.45, (-0.12, 0.0), n=28), (250, 148, 40)),
        Part(regular_polygon(10, 0.09, centre=(-0.55, -0.1)), (20, 20, 20), outlined=False),
    ),
    "cup": (
        Part(arc(0.32, -80.0, 80.0, (0.56, 0.0), n=12), (238, 238, 232), width=0.13),
        Part(np.array([[-0.62, -0.62], [0.62, -0.62], [0.46, 0.72], [-0.46, 0.72]]), (238, 238, 232)),
        Part(ellipse(0.56, 0.08, (0.0, -0.56), n=16), (100, 58, 28), outlined=False),
    ),
    "boat": (
        Part(np.array([[0.0, 0.4], [0.0, -0.95]]), (95, 62, 40), width=0.08),
        Part(np.array([[0.06, -0.9], [0.06, 0.28], [0.78, 0.28]]), (246, 246, 240)),
        Part(np.array([[-1.0, 0.35], [1.0, 0.35], [0.7, 0.8], [-0.7, 0.8]]), (135, 58, 40)),
    ),
    "kite": (
        Part(np.array([[0.0, 0.5], [0.22, 0.72], [-0.1, 0.86], [0.12, 1.0]]), (200, 40, 40), width=0.06),
        Part(np.array([[0.0, -1.0], [0.6, -0.25], [0.0, 0.5], [-0.6, -0.25]]), (246, 216, 45)),
        Part(np.array([[0.0, -1.0], [0.0, 0.5]]), (150, 110, 30), width=0.05),
        Part(np.array([[-0.6, -0.25], [0.6, -0.25]]), (150, 110, 30), width=0.05),
    ),
    "mushroom": (
        Part(rect(-0.22, -0.05, 0.22, 0.85), (242, 232, 210)),
        Part(_half_disc(0.85, (0.0, 0.05)), (200, 38, 38)),
        Part(regular_polygon(10, 0.12, centre=(-0.42, -0.28)), (250, 250, 250), outlined=False),
        Part(regular_polygon(10, 0.12, centre=(0.08, -0.55)), (250, 250, 250), outlined=False),
        Part(regular_polygon(10, 0.12, centre=(0.45, -0.2)), (250, 250, 250), outlined=False),
    ),
    "umbrella": (
        Part(np.concatenate([np.array([[0.0, -0.05], [0.0, 0.7]]), arc(0.16, 0.0, 180.0, (-0.16, 0.7), n=8)]), (60, 40, 30), width=0.08),
        Part(_half_disc(0.95, (0.0, -0.05)), (132, 60, 182)),
    ),
}


def category_strokes(name: str, centre: tuple[float, float], radius: float, angle: float, brightness: float, shift: np.ndarray, factor: int) -> list[Stroke]:
    """Strokes of one category instance; every colour gets the same brightness and (3,) shift jitter."""
    strokes = []
    for part in CATEGORY_PARTS[name]:
        points = place(part.points, centre, radius, angle)
        colour = jitter_colour(part.colour, brightness, shift)
        if part.width > 0:
            strokes.append(Stroke(points, colour, width=max(1, int(round(part.width * radius)))))
        else:
            strokes.append(Stroke(points, colour, outline=OUTLINE if part.outlined else None, outline_width=factor))
    return strokes
