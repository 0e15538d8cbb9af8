"""What every stage's `main` shares: argv parsing of --params/--root, the CPU threads it computes with, logging,
deterministic kernels, one-line errors.

The CPU threads come from params.yaml (`threads`), never from the machine, the shell or the batch job: torch's
CPU results (reductions, matrix products, the order a pool of threads adds partial sums) depend on the number of
threads, so a stage run by `dvc repro` on a laptop, by a Dask worker of `cedar flow` (which sets one thread in its
workers) and in a SLURM job of one CPU (whose task/affinity binding makes the libraries see one core) must be told
the same number to write the same bytes. The stage modules import torch and numpy at their top, before their
`main` runs; so the count is applied through the libraries' own setters (torch's intra- and inter-op pools, every
BLAS and OpenMP pool already loaded, through threadpoolctl) and through the environment variables, which libraries
loaded later and child processes (data loader workers) read when they start.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

from pipeline.config import Params, ParamsError
from pipeline.provenance import source_digest
from pipeline.store import StoreError

#: the repository root: the stages' code paths (`code_digest`) are relative to it
CODE_ROOT = Path(__file__).resolve().parents[1]

#: exceptions that are the user's input problems: reported as one line, exit status 2, no traceback.
USER_ERRORS = (ParamsError, StoreError, FileNotFoundError, ValueError, KeyError)


#: the environment variables through which torch, OpenMP, MKL, OpenBLAS (numpy, scipy) and Apple's Accelerate read
#: their thread counts
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


class StageParser(argparse.ArgumentParser):
    """A stage's command line: parsing it also fixes the process's CPU threads from the params file it names
    (`use_threads`), so that every stage does so before any work, whatever its `main` does next."""

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        parsed = super().parse_args(args, namespace)
        use_threads(params_threads(parsed.params))
        return parsed


def params_threads(path: Path) -> int:
    """`threads` of the params file at `path`; the schema's default when the file, or a valid value, is missing (the
    stage's own validation of the file then stops it with the file's problems)."""
    default = Params.model_fields["threads"].default
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return default
    value = raw.get("threads", default) if isinstance(raw, dict) else default
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else default


def use_threads(threads: int) -> None:
    """Compute on `threads` CPU threads from now on, in this process and the processes it starts: the environment
    variables (libraries loaded later, child processes, `pipeline.metrics.threads`), torch's intra-op pool and its
    inter-op pool, and every BLAS/OpenMP pool already loaded (threadpoolctl)."""
    import torch
    from threadpoolctl import threadpool_limits

    for variable in THREAD_VARIABLES:
        os.environ[variable] = str(threads)
    torch.set_num_threads(threads)
    if torch.get_num_interop_threads() != threads:
        try:
            torch.set_num_interop_threads(threads)
        except RuntimeError:  # settable once, before inter-op work starts (a second stage main in one test process);
            pass  # the inter-op pool runs independent ops side by side and does not change any result
    threadpool_limits(limits=threads)
    logging.getLogger(__name__).debug("computing on %d CPU threads (params.yaml threads)", threads)


def parser(description: str) -> argparse.ArgumentParser:
    p = StageParser(description=description)
    p.add_argument("--params", type=Path, default=Path("params.yaml"), help="params file (default: params.yaml)")
    p.add_argument("--root", type=Path, default=Path("."), help="project root holding store/ and reports/")
    return p


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")


def deterministic_kernels() -> None:
    """Same inputs, same outputs, on any runner (`dvc repro`, a Dask worker of `cedar flow`, a batch job) on the same
    kind of device (the CPU threads are params', `use_threads`): torch's deterministic kernels (cuBLAS needs its
    workspace setting before CUDA starts), no cuDNN autotuning. Ops without a deterministic kernel warn instead of
    failing."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False


def run_main(name: str, body: Callable[[], object]) -> int:
    """Run a stage body; user errors become `error: <stage>: <message>` on stderr and exit code 2."""
    setup_logging()
    deterministic_kernels()
    try:
        body()
    except USER_ERRORS as e:
        message = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
        print(f"error: {name}: {message}", file=sys.stderr)
        return 2
    return 0


def cell_main(name: str, description: str, run: Callable[..., object], argv: list[str] | None) -> int:
    """`main` of the grid-cell stage (stages.cell): --method, --size (SAEs), --k name the cell."""
    p = parser(description)
    p.add_argument("--method", required=True)
    p.add_argument("--size", type=int, default=None, help="dictionary size (SAEs); rotations use d")
    p.add_argument("--k", type=int, required=True)
    args = p.parse_args(argv)

    def body() -> None:
        from pipeline.config import load_params
        from pipeline.paths import Layout

        params = load_params(args.params)
        run(params, Layout(args.root), params.cell(args.method, args.size, args.k))

    return run_main(name, body)


def code_digest(paths: tuple[str, ...]) -> str:
    """Digest of the source of `paths` (files or folders relative to the repository root; a stage lists its dvc.yaml
    code deps): what outputs record as the code that made them. It depends on the code's content only, so the same
    code writes byte-identical outputs whatever the git commit or working-tree state."""
    return source_digest(paths, CODE_ROOT)


def exit_with(code: int) -> None:
    sys.exit(code)


__all__: Sequence[str] = ["parser", "run_main", "cell_main", "code_digest", "exit_with", "setup_logging", "deterministic_kernels",
                          "use_threads", "params_threads", "THREAD_VARIABLES", "CODE_ROOT"]
