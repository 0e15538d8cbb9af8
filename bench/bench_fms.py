"""Benchmark: FMS on the code sets of bench_evaluate's two cells, this tree's against another revision's, side by side.

    python bench/bench_fms.py [--workdir DIR] [--against REV] [--repeat 4] [bench_evaluate's project options]

The evaluate stage of each cell of bench/bench_evaluate.py's synthetic project (built there, or reused with the same
options in --workdir) runs once, with `pipeline.scoring.concepts.fms_of_sets` wrapped so that the inputs of its call
(the three code sets: the trained model's codes, its untrained twin's, random codes, on the test pool; the concepts'
labels) are kept. Then the cell's FMS runs --repeat times with this tree's `pipeline.metrics.fms`; with --against,
alternating with the `pipeline/metrics/fms.py` of git revision REV (its file loaded as a module of its own: its
`fms_of_sets`, or, in a revision from before it, one `fms` call per set), and every result of the two must be
identical (per-concept scores, depths, removal chains, roots), or the run stops.

Output: one JSON line per cell: each set's shape and non-zeros per row, the seconds of every run of each version (the
three sets together) and the best of each; then one line with the sums of the bests. Threads: whatever torch gets
from the environment (OMP_NUM_THREADS=2 for "2 cores"). On a machine whose speed drifts within minutes, compare only
versions timed alternately in one run, as here.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import bench_evaluate  # noqa: E402
import numpy as np  # noqa: E402

from pipeline.config import load_params  # noqa: E402
from pipeline.metrics import fms as this_fms  # noqa: E402
from pipeline.paths import Layout  # noqa: E402
from pipeline.training.device import resolve_device  # noqa: E402

SAME = ("per_concept", "root_accuracy", "local", "global_", "root_feature", "depth", "cut_accuracy")


def captured_code_sets(root: Path) -> list[tuple[str, list[Any], np.ndarray, dict[str, Any]]]:
    """(cell, code sets, labels, options) of the FMS call of the evaluate stage of each cell (models trained if needed)."""
    import pipeline.scoring.concepts as concepts
    from pipeline.training.cell_training import train_cell
    from stages import evaluate, probes

    p, layout = load_params(root / "params.yaml"), Layout(root)
    probes.run(p, layout)
    calls: list[tuple[str, list[Any], np.ndarray, dict[str, Any]]] = []
    fms_of_sets = concepts.fms_of_sets
    for cell in reversed(p.cells()):
        train_cell(p, layout, cell)

        def keep(code_sets: list[Any], labels: np.ndarray, _cell: str = cell.name, **options: Any) -> Any:
            calls.append((_cell, list(code_sets), labels, options))
            return fms_of_sets(code_sets, labels, **options)

        concepts.fms_of_sets = keep
        try:
            shutil.rmtree(layout.codes(cell.name), ignore_errors=True)
            evaluate.run(p, layout, cell)
        finally:
            concepts.fms_of_sets = fms_of_sets
    return calls


def of_sets(module: ModuleType, code_sets: list[Any], labels: np.ndarray, options: dict[str, Any]) -> list[Any]:
    """The FMS of each set with `module`: its `fms_of_sets`, or one `fms` call per set where it has none."""
    if hasattr(module, "fms_of_sets"):
        return module.fms_of_sets(code_sets, labels, **options)
    return [module.fms(codes, labels, **options) for codes in code_sets]


def module_at(rev: str) -> ModuleType:
    """`pipeline/metrics/fms.py` as it is at git revision `rev`, loaded as a module of its own."""
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:pipeline/metrics/fms.py"], check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp(prefix="bench_fms-")) / "fms_against.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("fms_against", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["fms_against"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_evaluate.add_project_options(parser, device="cpu")  # cpu: the two-core yardstick
    parser.add_argument("--against", default=None, help="a git revision whose pipeline/metrics/fms.py runs alternately with this tree's")
    parser.add_argument("--repeat", type=int, default=4)
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat: expected >= 1, got {args.repeat}")
    args.device, args.reuse = str(resolve_device(args.device)), True
    root = bench_evaluate.project(args, args.workdir or Path(tempfile.mkdtemp(prefix="bench_fms-")))
    versions = {"this": this_fms}
    if args.against:
        versions[args.against] = module_at(args.against)
    best = dict.fromkeys(versions, 0.0)
    for cell, code_sets, labels, options in captured_code_sets(root):
        seconds: dict[str, list[float]] = {version: [] for version in versions}
        for i in range(args.repeat):
            results = {}
            for version in list(versions) if i % 2 == 0 else list(versions)[::-1]:
                start = time.perf_counter()
                results[version] = of_sets(versions[version], code_sets, labels, options)
                seconds[version].append(round(time.perf_counter() - start, 3))
            for version, per_set in results.items():
                for j, (result, reference) in enumerate(zip(per_set, results["this"])):
                    for field in SAME:
                        if not np.array_equal(getattr(result, field), getattr(reference, field), equal_nan=True):
                            sys.exit(f"bench_fms: {cell}, code set {j}: {field} differs between this tree and {version}")
        for version in versions:
            best[version] += min(seconds[version])
        print(json.dumps({"cell": cell, "code_sets": [{"shape": list(c.shape), "nnz_per_row": round(c.nnz / c.shape[0], 2)} for c in code_sets],
                          "seconds": seconds, "best": {v: min(s) for v, s in seconds.items()}}), flush=True)
    print(json.dumps({"sum_of_bests": {v: round(s, 3) for v, s in best.items()}, "identical": True}), flush=True)


if __name__ == "__main__":
    main()
