"""Scoring trained models: the metrics (`pipeline.metrics`) applied to a model, its untrained twin and random codes.

- `encoding_pass`: one streamed pass of a model over rows (FVU, L0, dead latents, codes, probe scores); the FVU-vs-K curve.
- `codes`: the sparse code sets that pass writes, read back by row; random codes.
- `concepts`: concept metrics (matching, Delta-MATCHScore, TAPAScore, CKNNA, FMS, probes) as frozen results.
- `cell_evaluation`: one grid cell evaluated in three steps (encode pass, concept metrics, explanations).
- `timings`: the seconds of each part of an evaluation.
- `planted`: the planted-structure recovery benchmark. `options`: the settings of both.
"""
