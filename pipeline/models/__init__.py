"""Sparse models behind one interface (`base.SparseModel`): CEDAR (`cedar`), the rotation baselines (`rotations`),
the SAEs (`sae` base, `topk`, `penalty`), their options (`options`, light: no torch), the registry that builds them
by name (`registry.build`) and their checkpoints (`checkpoint`). Importing this package loads nothing."""
