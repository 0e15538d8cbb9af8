"""Evaluation metrics: functions of arrays, no I/O, nothing else of this project. numpy and scipy.sparse throughout;
torch where a metric is heavy enough to run on the evaluation's device (FMS's trees, the linear probes: they take a
`device`, "cpu" by default); scikit-learn nowhere in a metric (it is the reference of their tests).

Modules (import them directly; this package imports nothing heavy on purpose):

- `reconstruction`: FVU, L0 (K), dead-latent fraction, and a streaming float64 accumulator.
- `cknna`: mutual-kNN kernel alignment (CKNNA) between codes/reconstructions and embeddings.
- `probe`: linear-probe cross-entropy on originals vs reconstructions, and their KL (torch).
- `fms`: Feature Monosemanticity Score (decision trees on codes per concept, torch).
- `matching`: one-to-one matching and FBMP coalitions of binarised latents to attributes; MATCHScore.
- `tapas`: TAPAScore and Delta-stay on paired (edited) images.
- `recovery`: axis recovery of a planted basis.

Definitions are in docs/science.md.
"""
