"""The caption decoder's word-level tokenizer and vocabulary (special tokens first, then words by frequency)."""

from __future__ import annotations

import re
from collections import Counter

from pipeline.explain.relevance import check_captions

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)  # ids 0..3, in this order
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)
_TOKEN = re.compile(r"[^\W_]+(?:[-'][^\W_]+)*|[^\w\s]")
_NO_SPACE_BEFORE = frozenset(",.;:!?)")


def tokenize(text: str) -> list[str]:
    """Word-level tokens: words (inner hyphens/apostrophes kept: "medium-sized") and single punctuation marks.

    Case is kept, so `detokenize(tokenize(c)) == c` for captions with single spaces and no space
    before punctuation (every scene-world caption).
    """
    return _TOKEN.findall(text)


def detokenize(tokens: list[str]) -> str:
    """Join tokens with spaces, without a space before , . ; : ! ? )."""
    text = ""
    for token in tokens:
        text += token if (not text or token in _NO_SPACE_BEFORE) else " " + token
    return text


def build_vocabulary(captions: list[str], min_count: int = 1) -> list[str]:
    """The decoder's vocabulary: the 4 special tokens, then every token seen >= min_count times,
    most frequent first (ties alphabetically, so the vocabulary is deterministic)."""
    check_captions(captions)
    counts = Counter(token for caption in captions for token in tokenize(caption))
    words = sorted((w for w, c in counts.items() if c >= min_count and w not in SPECIAL_TOKENS), key=lambda w: (-counts[w], w))
    if not words:
        raise ValueError(f"captions: no word occurs >= {min_count} times; cannot build an empty vocabulary")
    return list(SPECIAL_TOKENS) + words
