"""The words of the procedural scene world: attribute families, object categories and the concept vocabulary.

Object scenes (CUB-like) have one object per image, described by seven one-hot attribute *families*; each
value of a family is one binary attribute column, named by a natural phrase usable as a text prompt
("red body", "striped pattern"). Multi-object scenes (COCO-like) have one column per object category,
named by the category word ("tree").

The concept vocabulary (what concept naming ranks against) is every attribute phrase plus a few hundred
common English distractor words, so naming a latent is not a closed-world lookup among the true answers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """One attribute family of the object scenes.

    name: the family key ("body colour"). values: the word of each value, as it appears in captions
    ("red"). phrases: the attribute name of each value ("red body"), in column order.
    """

    name: str
    values: tuple[str, ...]
    phrases: tuple[str, ...]


def _family(name: str, values: tuple[str, ...], suffix: str) -> Family:
    return Family(name, values, tuple(f"{v} {suffix}" for v in values))


# Order matters: it fixes the attribute columns and the per-image random draws.
SHAPES = ("circle", "square", "triangle", "hexagon", "star", "cross")
BODY_COLOURS = ("red", "green", "blue", "yellow", "purple", "orange")
TOP_COLOURS = ("white", "black", "cyan", "pink", "brown", "gray")  # own palette: no word shared with the body
TOP_SHAPES = ("round", "pointed", "flat")
PATTERNS = ("solid", "striped", "spotted", "checkered")
SIZES = ("small", "medium", "large")
BACKGROUNDS = ("grass", "sky", "sand", "snow", "night", "wood")

FAMILIES: tuple[Family, ...] = (
    _family("shape", SHAPES, "shape"),
    _family("body colour", BODY_COLOURS, "body"),
    _family("top colour", TOP_COLOURS, "top"),
    _family("top shape", TOP_SHAPES, "top"),
    _family("pattern", PATTERNS, "pattern"),
    _family("size", SIZES, "object"),
    _family("background", BACKGROUNDS, "background"),
)

CATEGORIES = ("ball", "box", "tree", "house", "car", "flower", "fish", "cup", "boat", "kite", "mushroom", "umbrella")


def object_attribute_names() -> list[str]:
    """The A = 34 attribute names of object scenes, in column order (family by family)."""
    return [phrase for family in FAMILIES for phrase in family.phrases]


def object_family_columns() -> dict[str, list[int]]:
    """Family name -> its attribute columns (consecutive, in value order)."""
    columns: dict[str, list[int]] = {}
    start = 0
    for family in FAMILIES:
        columns[family.name] = list(range(start, start + len(family.values)))
        start += len(family.values)
    return columns


# Common English nouns and adjectives that are not attributes of this world. None equals an attribute
# phrase or a category word (checked by `vocabulary`), but several are close (colours, shapes, textures)
# on purpose: a concept namer has to tell "red body" from "crimson" and "tree" from "forest".
DISTRACTORS: tuple[str, ...] = (
    # animals
    "dog", "cat", "horse", "cow", "sheep", "pig", "goat", "rabbit", "mouse", "bird", "duck", "chicken",
    "eagle", "owl", "parrot", "penguin", "lion", "tiger", "bear", "wolf", "fox", "deer", "elephant",
    "giraffe", "zebra", "monkey", "snake", "frog", "turtle", "whale", "dolphin", "shark", "crab",
    "butterfly", "bee", "spider", "ant", "snail", "squirrel", "camel",
    # food
    "apple", "banana", "orange fruit", "lemon", "grape", "strawberry", "cherry", "pear", "peach",
    "bread", "cheese", "cake", "pizza", "sandwich", "soup", "rice", "egg", "carrot", "potato", "tomato",
    "onion", "cookie", "chocolate", "coffee", "tea", "milk", "juice", "salad", "pie", "honey",
    # household things
    "chair", "table", "bed", "sofa", "lamp", "door", "window", "mirror", "clock", "book", "pen",
    "pencil", "paper", "bag", "shoe", "hat", "shirt", "dress", "coat", "glove", "sock", "spoon", "fork",
    "knife", "plate", "bowl", "bottle", "glass", "candle", "pillow", "blanket", "key", "phone",
    "computer", "keyboard", "television", "camera", "radio", "guitar", "piano", "drum", "violin",
    "basket", "bucket", "ladder", "hammer", "scissors", "brush", "rope", "chain", "coin", "ring",
    "necklace", "watch", "wallet", "ticket", "letter", "envelope", "stamp", "map", "flag", "toy",
    # vehicles and places
    "bicycle", "motorcycle", "bus", "truck", "train", "airplane", "helicopter", "ship", "rocket",
    "tractor", "road", "bridge", "tower", "castle", "church", "school", "hospital", "office", "shop",
    "market", "garden", "park", "street", "city", "village", "farm", "kitchen", "bedroom", "bathroom",
    "library", "museum", "station", "airport", "harbor", "stadium",
    # nature
    "mountain", "hill", "river", "lake", "ocean", "island", "forest", "desert", "valley", "cave",
    "rock", "stone", "leaf", "branch", "root", "seed", "cloud", "rain", "storm", "wind", "fire",
    "smoke", "ice", "moon", "sun", "planet", "rainbow", "wave", "mud", "dust", "shadow", "light",
    # people and abstract nouns
    "person", "man", "woman", "child", "baby", "family", "friend", "teacher", "doctor", "farmer",
    "soldier", "king", "queen", "crowd", "team", "music", "dance", "game", "sport", "party",
    "holiday", "journey", "dream", "story", "idea", "memory", "silence", "danger", "freedom", "peace",
    "time", "money", "energy", "power", "science", "history", "language", "number", "question", "answer",
    # adjectives
    "happy", "sad", "angry", "calm", "quiet", "loud", "bright", "dark", "dull", "shiny", "soft",
    "hard", "smooth", "rough", "wet", "dry", "hot", "cold", "warm", "cool", "old", "new", "young",
    "ancient", "modern", "heavy", "light weight", "fast", "slow", "strong", "weak", "clean", "dirty",
    "empty", "full", "open", "closed", "rich", "poor", "cheap", "expensive", "beautiful", "ugly",
    "strange", "famous", "simple", "complex", "sharp", "blunt", "thick", "thin", "narrow", "wide",
    "deep", "shallow", "tall", "short", "long", "curved", "straight", "wooden", "metal", "plastic",
    "glassy", "furry", "fluffy", "wrinkled", "broken", "frozen", "burning", "floating", "flying",
    "sleeping", "running", "crimson", "scarlet", "navy", "turquoise", "violet", "beige", "golden",
    "silver", "transparent", "colorful", "striped shirt", "polka dots", "plaid", "zigzag", "spiral",
    "oval", "rectangle", "pentagon", "octagon", "crescent", "heart shape", "arrow", "diamond",
)


def vocabulary(attribute_names: list[str] | None = None) -> list[str]:
    """Concept vocabulary: attribute phrases first (column order), then the distractors; unique.

    With `attribute_names`, the phrases are those; without, the attribute names of both kinds of scene
    (object attributes, then categories).
    """
    phrases = list(attribute_names) if attribute_names is not None else object_attribute_names() + list(CATEGORIES)
    seen: set[str] = set()
    words: list[str] = []
    for word in phrases + list(DISTRACTORS):
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words
