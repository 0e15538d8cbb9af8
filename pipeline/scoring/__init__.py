"""Scoring trained models: the metrics (`pipeline.metrics`) applied to a model, its untrained twin and random codes.

- `reconstruction`: FVU, L0 and dead latents streamed over a store; the FVU-vs-K curve.
- `concepts`: concept metrics (matching, Delta-MATCHScore, TAPAScore, CKNNA, FMS, probes) and their settings.
- `cell`: one grid cell evaluated end to end (reconstruction, concepts, explanations).
- `planted`: the planted-structure recovery benchmark.
"""
