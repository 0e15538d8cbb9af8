"""Data: where images and labels come from, and the dataset the data stage writes.

- `sources`: the sources params.yaml can name (`scenes`, `folders`, `cub`, `coco`, `syn`) and reading one.
- `world/`: the procedural offline world (vocabulary, rendering, captions, scenes and one-attribute edits).
- `table`, `folders`, `cub`, `coco`, `syn`: loaders of real datasets on disk.
- `images`: image files: decoding, and batches decoded in DataLoader workers.
- `phrases`: the phrases that state an attribute in a caption.
- `dataset`: the on-disk dataset every later stage reads.
- `planted`: synthetic embeddings with a planted sparse basis.
"""
