"""One module per DVC stage. Each has `run(...)` (the work, through `pipeline`) and `main(argv)` (argv parsing).

`dvc.yaml` calls `python -m stages.<name> ...`; `pipeline.flow` calls the same `run` functions.
"""
