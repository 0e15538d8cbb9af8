"""The applications of the library: one module per DVC stage, the Prefect flow and the `cedar` command.

Each stage module has `run(...)` (the work, through `pipeline`) and `main(argv)` (argv parsing); `dvc.yaml`
calls `python -m stages.<name> ...` and `stages.flow` runs the same commands. The library (`pipeline`) never
imports this package.
"""
