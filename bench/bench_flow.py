"""`dvc repro` against `cedar flow` on a local Dask cluster, from an empty store, in one run; then the cost of each
when nothing is stale. Or, with --flow-only, `cedar flow` alone on a large sweep (--wide).

Two copies of the project's tracked files (one commit, the chosen preset) in scratch git repositories; `dvc repro`
runs in one and `cedar flow --cluster bench` (a local cluster of --workers stages at once) in the other, one after
the other, each with this shell's environment. Both take params' `threads` (--threads sets it in both), whatever
the shell says, so both write the same outputs, which the bench checks in dvc.lock.

--wide widens the preset's grid to five SAE methods x four dictionary sizes x six ks and five rotation methods x six
ks (150 cells; with data, encoder, extract, captions, planted and report 156 stages). With --flow-only the bench
runs only the flow, then `dvc status`, and reports whether DVC finds everything up to date.

    python bench/bench_flow.py                       # the default preset, 2 workers
    python bench/bench_flow.py --preset tiny --threads 1
    python bench/bench_flow.py --preset synthetic-tiny --wide --flow-only
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.presets import preset_text  # noqa: E402


def project_copy(path: Path, preset: str) -> Path:
    """The tracked files of this checkout (as they are now) in a fresh git repository at `path`, with `preset`."""
    for name in subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.splitlines():
        if (ROOT / name).is_file():
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, path / name)
    (path / "params.yaml").write_text(preset_text(preset))
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.email=b@b", "-c", "user.name=bench", "commit", "-qm", "bench"]):
        subprocess.run(["git", *args], cwd=path, check=True)
    return path


#: the --wide grid; every k fits d = 16 (synthetic-tiny: the models refuse k > d) and every dictionary size
WIDE = {"rotation": {"methods": ["cedar", "identity", "pca", "ica", "random_rotation"], "ks": [1, 2, 4, 8, 12, 16]},
        "sae": {"methods": ["relu", "topk", "batchtopk", "jumprelu", "matryoshka"], "dict_sizes": [32, 64, 128, 256], "ks": [1, 2, 4, 8, 12, 16]}}


def set_params(path: Path, threads: int | None, wide: bool) -> None:
    """`threads` and the --wide grid (with an entry for every method it sweeps) in the params file at `path`."""
    params = yaml.safe_load(path.read_text())
    if threads is not None:
        params["threads"] = threads
    if wide:
        params["sweep"] = WIDE
        for method in [*WIDE["rotation"]["methods"], *WIDE["sae"]["methods"]]:
            params["methods"].setdefault(method, {})
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def timed(command: list[str], cwd: Path, env: dict[str, str], log: Path) -> float:
    """Wall seconds of `command`; its output goes to `log`; fails loudly when it fails."""
    start = time.perf_counter()
    with open(log, "a") as out:
        result = subprocess.run(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed (exit {result.returncode}); see {log}")
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="default")
    p.add_argument("--workers", type=int, default=2, help="stages at once in the flow's local cluster (default 2)")
    p.add_argument("--processes", action="store_true", help="worker processes instead of threads")
    p.add_argument("--threads", type=int, default=None, help="params.yaml `threads` of both runs (default: the preset's)")
    p.add_argument("--wide", action="store_true", help="the 150-cell grid (156 stages): five methods of each family, six ks")
    p.add_argument("--flow-only", action="store_true", help="only `cedar flow` from an empty store, then `dvc status`")
    p.add_argument("--keep", action="store_true", help="keep the scratch projects")
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench_flow-"))
    repro = project_copy(base / "repro", args.preset)
    set_params(repro / "params.yaml", args.threads, args.wide)
    flow = base / "flow"
    shutil.copytree(repro, flow, symlinks=True)  # the same commit: records of the code version agree
    cluster = {"kind": "local", "workers": args.workers, "processes": args.processes, "dashboard": None}
    (base / "cluster.yaml").write_text(yaml.safe_dump({"bench": cluster}))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": ""}
    env.pop("PREFECT_API_URL", None)
    dvc = [sys.executable, "-m", "dvc", "repro"]
    cedar = [sys.executable, "-m", "cli", "flow", "--cluster", "bench", "--cluster-file", str(base / "cluster.yaml")]
    threads = yaml.safe_load((repro / "params.yaml").read_text())["threads"]
    print(f"preset {args.preset}{' (wide grid)' if args.wide else ''}, {os.cpu_count()} CPUs, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}, "
          f"flow: {args.workers} {'process' if args.processes else 'thread'} workers, params threads: {threads}; logs in {base}")
    if args.flow_only:
        try:
            seconds = timed(cedar, flow, env, base / "flow.log")
        finally:  # a flow of more than 50 stages started the project's Prefect server
            subprocess.run(cedar[:3] + ["server", "stop"], cwd=flow, env=env, capture_output=True)
        stages = len(yaml.safe_load((flow / "dvc.lock").read_text())["stages"])
        status = subprocess.run([sys.executable, "-m", "dvc", "status"], cwd=flow, env=env, capture_output=True, text=True).stdout.strip()
        print(f"cedar flow from an empty store: {stages} stages recorded in dvc.lock in {seconds:.0f} s ({seconds / 60:.1f} min); "
              f"dvc status afterwards: {status!r}")
        if not args.keep:
            shutil.rmtree(base)
        return
    full = {"dvc repro": timed(dvc, repro, env, base / "repro.log"), "cedar flow": timed(cedar, flow, env, base / "flow.log")}
    noop = {"dvc repro": timed(dvc, repro, env, base / "repro.log"), "cedar flow": timed(cedar, flow, env, base / "flow.log")}
    stages = len(yaml.safe_load((repro / "dvc.lock").read_text())["stages"])
    same = yaml.safe_load((repro / "dvc.lock").read_text()) == yaml.safe_load((flow / "dvc.lock").read_text())
    print(f"{'':<26}{'dvc repro':>12}{'cedar flow':>12}{'ratio':>8}")
    print(f"{f'from an empty store ({stages} stages)':<26}{full['dvc repro']:>11.1f}s{full['cedar flow']:>11.1f}s{full['cedar flow'] / full['dvc repro']:>8.2f}")
    print(f"{'nothing stale':<26}{noop['dvc repro']:>11.1f}s{noop['cedar flow']:>11.1f}s{noop['cedar flow'] / noop['dvc repro']:>8.2f}")
    print(f"dvc.lock of both runs identical (every output the same): {same}")
    if not args.keep:
        shutil.rmtree(base)


if __name__ == "__main__":
    main()
