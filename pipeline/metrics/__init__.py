"""Evaluation metrics: pure numpy/scikit-learn functions, no I/O, no torch, nothing else of this project.

Modules (import them directly; this package imports nothing heavy on purpose):

- `reconstruction`: FVU, L0 (K), dead-latent fraction, and a streaming float64 accumulator.
- `cknna`: mutual-kNN kernel alignment (CKNNA) between codes/reconstructions and embeddings.
- `probe`: linear-probe cross-entropy on originals vs reconstructions, and their KL.
- `fms`: Feature Monosemanticity Score (decision trees on codes per concept).
- `matching`: one-to-one matching and FBMP coalitions of binarised latents to attributes; MATCHScore.
- `tapas`: TAPAScore and Delta-stay on paired (edited) images.
- `recovery`: axis recovery of a planted basis.

Definitions are in docs/science.md.
"""
