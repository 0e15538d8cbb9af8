"""Explanations of sparse codes (the interpretability modes).

- `naming`: concept-based mode. Each latent (a CEDAR half-axis +u_i / -u_i, or an SAE decoder row) is named by
  the vocabulary concepts whose centred text embeddings are most cosine-similar to its direction; an image is
  explained by its active latents' names. The dense embedding's nearest concepts are the reference.
- `tokens`, `decoder`: the embedded caption decoder (a small prefix-conditioned transformer trained here, the
  offline default): its tokenizer and vocabulary, the model, its training through the one loop, greedy decoding.
- `captions`: free-form mode. The decoder reads an embedding (dense, a sparse reconstruction, or a top-k code in
  the original basis) and writes a caption; `blip`: the same with BLIP through `transformers` for users with weights.
- `relevance`: automatic stand-ins for the user studies on data with ground-truth attributes: precision and
  recall of the named concepts, and the rate at which generated captions "describe the image".
- `run`: every explanation of one trained run (what the evaluate stage writes to explain.json).

Library code only: no file I/O except `decoder.save_decoder` / `decoder.load_decoder`.
"""
