"""The DVC stages: one module per stage of dvc.yaml (`python -m stages.<name> ...`), each with `run(...)`, the work,
done through the library (`pipeline`), and `main(argv)`, its command line (`stages.runner` holds what every
stage's `main` shares: argv, logging, deterministic kernels, one-line errors). The flow (`flow`) runs the same
commands on a cluster; the `cedar` command (`cli`) is the third application. The library never imports them.
"""
