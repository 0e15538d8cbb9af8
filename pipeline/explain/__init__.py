"""Explanations of sparse codes (SPEC section A, interpretability modes).

- `naming`: concept-based mode. Each latent (a CEDAR half-axis +u_i / -u_i, or an SAE decoder row) is
  named by the vocabulary concepts whose centred text embeddings are most cosine-similar to its direction;
  an image is explained by its active latents' names. The dense embedding's nearest concepts are the
  reference.
- `captions`: free-form mode. A text decoder reads an embedding (dense, a sparse reconstruction, or a
  top-k code in the original basis) and writes a caption: a small prefix-conditioned transformer trained
  here (the offline default) or BLIP through `transformers` for users with weights.
- `relevance`: automatic stand-ins for the user studies on data with ground-truth attributes: precision
  and recall of the named concepts, and the rate at which generated captions "describe the image".

Library code only: no file I/O except `captions.save_decoder` / `captions.load_decoder`.
"""
