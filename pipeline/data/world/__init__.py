"""The procedural scene world: the offline stand-in for CUB/COCO and synCUB/synCOCO.

`vocabulary` (the world's families, categories and word lists), `render` (drawing with PIL/numpy), `captions`
(captions, zero-shot prompts and caption phrases) and `scenes` (rendered sets and their one-attribute edits).
"""
