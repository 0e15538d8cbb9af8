"""`dvc repro` against `cedar flow` on a local Dask cluster, from an empty store, in one run; then the cost of each
when nothing is stale.

Two copies of the project's tracked files (one commit, the chosen preset) in scratch git repositories; `dvc repro`
runs in one and `cedar flow --cluster bench` (a local cluster of --workers stages at once) in the other, one after
the other, each with this shell's environment. The flow's stage processes get --threads CPU threads each when
given (else the same as `dvc repro`'s: then both write the same outputs, which the bench checks in dvc.lock).

    python bench/bench_flow.py                       # the default preset, 2 workers
    python bench/bench_flow.py --preset tiny --threads 1
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
    p.add_argument("--threads", type=int, default=None, help="CPU threads per stage process in the flow (default: as dvc repro)")
    p.add_argument("--keep", action="store_true", help="keep the scratch projects")
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench_flow-"))
    repro = project_copy(base / "repro", args.preset)
    flow = base / "flow"
    shutil.copytree(repro, flow, symlinks=True)  # the same commit: records of the code version agree
    cluster = {"kind": "local", "workers": args.workers, "processes": args.processes, "dashboard": None}
    if args.threads is not None:
        cluster["threads"] = args.threads
    (base / "cluster.yaml").write_text(yaml.safe_dump({"bench": cluster}))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": ""}
    env.pop("PREFECT_API_URL", None)
    dvc = [sys.executable, "-m", "dvc", "repro"]
    cedar = [sys.executable, "-m", "cli", "flow", "--cluster", "bench", "--cluster-file", str(base / "cluster.yaml")]
    print(f"preset {args.preset}, {os.cpu_count()} CPUs, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}, "
          f"flow: {args.workers} {'process' if args.processes else 'thread'} workers, threads per stage {args.threads or 'as dvc repro'}; logs in {base}")
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
