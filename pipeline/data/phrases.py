"""How a caption states an attribute: lower-case words and the phrases that name each attribute.

The concept evaluation reads generated captions and decides which attributes they state
(`pipeline.explain.relevance`). What counts as stating an attribute is knowledge of the dataset: the
procedural world knows its caption synonyms (`pipeline.data.world.texts.attribute_phrases`); a real
dataset states an attribute by its name or by a word of its name that no other attribute uses
(`name_phrases`). The data stage records the phrases of every attribute in the dataset (meta.json "phrases").
"""

from __future__ import annotations

import re

_WORD = re.compile(r"[a-z0-9]+(?:[-'][a-z0-9]+)*")


def words(text: str) -> list[str]:
    """Lower-case words of `text` (letters/digits, inner hyphens and apostrophes kept: "medium-sized")."""
    return _WORD.findall(text.lower())


def name_phrases(attribute_names: list[str]) -> list[list[str]]:
    """Per attribute: its full name plus each word of it that occurs in no other attribute name
    ("red body" -> ["red body", "red"] when no other name has "red"; "tree" -> ["tree"]). Lower case."""
    word_sets = [set(words(name)) for name in attribute_names]
    counts: dict[str, int] = {}
    for ws in word_sets:
        for w in ws:
            counts[w] = counts.get(w, 0) + 1
    return [list(dict.fromkeys([" ".join(words(name)), *(w for w in words(name) if counts[w] == 1)])) for name in attribute_names]
