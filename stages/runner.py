"""What every stage's `main` shares: argv parsing of --params/--root, logging, deterministic kernels, one-line errors."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pipeline.config import ParamsError
from pipeline.provenance import source_digest
from pipeline.store import StoreError

#: the repository root: the stages' code paths (`code_digest`) are relative to it
CODE_ROOT = Path(__file__).resolve().parents[1]

#: exceptions that are the user's input problems: reported as one line, exit status 2, no traceback.
USER_ERRORS = (ParamsError, StoreError, FileNotFoundError, ValueError, KeyError)


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--params", type=Path, default=Path("params.yaml"), help="params file (default: params.yaml)")
    p.add_argument("--root", type=Path, default=Path("."), help="project root holding store/ and reports/")
    return p


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")


def deterministic_kernels() -> None:
    """Same inputs, same outputs, on any runner (`dvc repro` or a Dask worker of `cedar flow`) with the same device
    and CPU thread count: torch's deterministic kernels (cuBLAS needs its workspace setting before CUDA starts),
    no cuDNN autotuning. Ops without a deterministic kernel warn instead of failing."""
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
                          "CODE_ROOT"]
