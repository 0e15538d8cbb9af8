"""Captions, zero-shot prompts and caption phrases for the procedural scenes.

Captions are generated from an image's attributes with several templates and synonyms, chosen by the
image's own uniform draws (so they are deterministic per image). Body colour, shape and category words are
never replaced by synonyms: a caption always names them literally (a property the tests check), while
size, pattern, top part and background words vary.
"""

from __future__ import annotations

import numpy as np

from pipeline.data.phrases import name_phrases, words
from pipeline.data.world.vocabulary import CATEGORIES, FAMILIES

SIZE_WORDS = {"small": ("small", "little"), "medium": ("medium-sized", "mid-sized"), "large": ("large", "big")}
PATTERN_WORDS = {"solid": ("solid", "plain"), "striped": ("striped", "stripy"), "spotted": ("spotted", "dotted"), "checkered": ("checkered", "chequered")}
TOP_SHAPE_WORDS = {"round": ("round", "rounded"), "pointed": ("pointed", "pointy"), "flat": ("flat", "flat")}
TOP_NOUNS = ("top", "head")
BACKGROUND_WORDS = {
    "grass": ("on grass", "on a lawn", "in a grassy field"),
    "sky": ("against the sky", "in a blue sky", "with sky behind it"),
    "sand": ("on sand", "on a sandy beach", "on sandy ground"),
    "snow": ("on snow", "in the snow", "on a snowy field"),
    "night": ("at night", "against a dark night sky", "under the night sky"),
    "wood": ("on a wooden floor", "on wooden planks", "on a wood table"),
}
OBJECT_TEMPLATES = (
    "a {size} {colour} {pattern} {shape} with a {tcol} {tshape} {top} {bg}",
    "a photo of a {size} {pattern} {colour} {shape} {bg}, with {tcol} wings and a {tshape} {top}",
    "a {colour} {shape} with a {pattern} pattern and a {tcol} {tshape} {top}, {size}, {bg}",
    "there is a {size} {colour} {shape} {bg}; it is {pattern} and has a {tshape} {tcol} {top}",
    "an image of a {pattern} {shape} coloured {colour}, {size}, with a {tcol} {top} that is {tshape}, {bg}",
)
MULTI_TEMPLATES = ("a scene with {objects} {bg}", "a photo of {objects} {bg}", "{objects} {bg}", "there is {objects} in this picture, {bg}")

N_CAPTION_DRAWS = 8  # uniforms a caption consumes


def _pick(options: tuple[str, ...], u: float) -> str:
    return options[min(int(u * len(options)), len(options) - 1)]


def with_articles(text: str) -> str:
    """Fix indefinite articles: 'a' before a vowel sound becomes 'an' ("a orange" -> "an orange")."""
    words = text.split(" ")
    for i in range(len(words) - 1):
        if words[i] in ("a", "A") and words[i + 1][:1].lower() in "aeiou":
            words[i] = words[i] + "n"
    return " ".join(words)


def object_caption(values: dict[str, str], u: np.ndarray) -> str:
    """Caption of an object scene. values: family name -> value word. u: (N_CAPTION_DRAWS,) uniforms in [0, 1)."""
    text = _pick(OBJECT_TEMPLATES, u[0]).format(
        size=_pick(SIZE_WORDS[values["size"]], u[1]),
        colour=values["body colour"],
        pattern=_pick(PATTERN_WORDS[values["pattern"]], u[2]),
        shape=values["shape"],
        tcol=values["top colour"],
        tshape=_pick(TOP_SHAPE_WORDS[values["top shape"]], u[3]),
        top=_pick(TOP_NOUNS, u[4]),
        bg=_pick(BACKGROUND_WORDS[values["background"]], u[5]),
    )
    return with_articles(text)


def multi_caption(categories: list[str], background: str, u: np.ndarray) -> str:
    """Caption of a multi-object scene naming every category present (in the given order) and the background."""
    named = [f"a {c}" for c in categories]
    objects = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
    text = _pick(MULTI_TEMPLATES, u[0]).format(objects=objects, bg=_pick(BACKGROUND_WORDS[background], u[1]))
    return with_articles(text)


_OBJECT_PROMPTS = {
    "shape": "a photo of a {v}",
    "body colour": "a photo of a {v} object",
    "top colour": "a photo of an object with a {v} top",
    "top shape": "a photo of an object with a {v} top",
    "pattern": "a photo of a {v} object",
    "size": "a photo of a {v} object",
    "background": "a photo of an object {bg}",
}


#: a prompt names a value as the captions do (their first wording): "medium-sized", never the bare column word
#: "medium", which no caption uses (measured: size zero-shot 0.66 with "medium", 0.74 with "medium-sized")
_CAPTION_WORDS = {"size": SIZE_WORDS, "pattern": PATTERN_WORDS, "top shape": TOP_SHAPE_WORDS}


def zero_shot_prompts(kind: str) -> dict[str, list[str]]:
    """Family -> one natural prompt per attribute of the family, in column order, for scenes of `kind`.

    Objects: e.g. "a photo of a striped object", each value in the captions' first wording ("a photo of a
    medium-sized object"); multi: {"object": ["a photo of a ball", ...]}.
    """
    if kind == "multi":
        return {"object": [with_articles(f"a photo of a {c}") for c in CATEGORIES]}
    if kind != "objects":
        raise ValueError(f"kind: expected 'objects' or 'multi', got {kind!r}")
    return {
        family.name: [with_articles(_OBJECT_PROMPTS[family.name].format(v=_CAPTION_WORDS.get(family.name, {}).get(v, (v,))[0],
                                                                       bg=BACKGROUND_WORDS.get(v, ("",))[0])) for v in family.values]
        for family in FAMILIES
    }


#: leading and trailing function words dropped from the synonym phrases ("on a lawn" -> "lawn"), so that a
#: caption that words the background a little differently from the templates is still recognised.
_FUNCTION_WORDS = frozenset({"a", "an", "the", "on", "in", "at", "against", "under", "with", "behind", "it"})
_SYNONYMS = {"size": SIZE_WORDS, "pattern": PATTERN_WORDS, "top shape": TOP_SHAPE_WORDS, "background": BACKGROUND_WORDS}


def attribute_phrases(attribute_names: list[str]) -> list[list[str]]:
    """The phrases a caption of this world uses to state each attribute (one list per name, lower case).

    An object attribute ("striped pattern", "grass background") is stated by its value word ("striped") and
    the caption synonyms above ("stripy"; "on a lawn", and "lawn" without its function words); any other name
    (a category such as "tree") falls back to `pipeline.data.phrases.name_phrases`.
    """
    known = {phrase: (family.name, value) for family in FAMILIES for value, phrase in zip(family.values, family.phrases)}
    fallback = name_phrases(attribute_names)
    out = []
    for name, generic in zip(attribute_names, fallback):
        if name not in known:
            out.append(generic)
            continue
        family, value = known[name]
        synonyms = list(_SYNONYMS.get(family, {}).get(value, ()))
        stripped = []
        for phrase in synonyms:
            kept = words(phrase)
            while kept and kept[0] in _FUNCTION_WORDS:
                kept = kept[1:]
            while kept and kept[-1] in _FUNCTION_WORDS:
                kept = kept[:-1]
            stripped.append(" ".join(kept))
        out.append(list(dict.fromkeys(p for p in (value, *synonyms, *stripped) if p)))
    return out
