"""Training: one loop for everything the pipeline trains.

- `loop`: the loop (`fit`), its options (`TrainSettings`), batch sources, the `Trainable` protocol.
- `schedule`: the learning-rate schedule (warm-up, cosine decay).
- `device`: the device rule ("auto" = cuda when present) and the `Device` settings type.
- `resume`: epoch checkpoints, so a killed run resumes where it stopped.
- `sparse`: training a sparse model (init, validation, early stopping) and the quick `fit_*` helpers.
"""
