"""Image sources for the pipeline.

`scenes` is the offline default: a procedural world of rendered images with exactly known attributes,
captions and one-attribute intervention pairs (the stand-in for CUB/COCO and synCUB/synCOCO). Its parts:
`vocabulary` (the world's families, categories and word lists), `render` (drawing with PIL/numpy) and
`captions` (captions and zero-shot prompts).
"""
