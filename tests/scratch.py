"""Scratch copies of the project for the tests that run DVC: a fresh git repository holding what a clone has, on the
tiny preset; `dvc` runs in it with this interpreter; `outputs` hashes what DVC tracks, to compare two runs.

The end-to-end and reliability tests share one finished `dvc repro` (the session fixture `tiny_repro` in
conftest.py) and work on copies of it (`copy_repo`): a copy keeps the git commit, so its stores and records are
byte-identical to the original's when recomputed from the same inputs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from pipeline.presets import preset_text

ROOT = Path(__file__).resolve().parents[1]


def scratch_copy(tmp: Path, params: str | None = None) -> Path:
    """The tracked project files (what a clone has) in a fresh git repository `tmp/repo`, with `params` (default: the
    tiny preset) as params.yaml."""
    repo = tmp / "repo"
    for name in ["pipeline", "stages", "flow", "cli", "dvc.yaml", "cluster.yaml", ".dvc/config", ".dvcignore", "pyproject.toml"]:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, repo / name)
    (repo / "params.yaml").write_text(preset_text("tiny") if params is None else params)
    (repo / ".gitignore").write_text("/store/\n/reports/\n.prefect/\n/logs/\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "scratch")
    return repo


def copy_repo(src: Path, dst: Path) -> Path:
    """A copy of a scratch repository with everything in it (git, DVC cache and lock, stores), times preserved."""
    shutil.copytree(src, dst, symlinks=True)
    return dst


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True)


def env() -> dict[str, str]:
    """The test's interpreter first on PATH, so dvc's `python -m stages...` runs in this environment."""
    e = dict(os.environ)
    e["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{e['PATH']}"
    e["PYTHONPATH"] = ""  # the scratch copy's own pipeline/ and stages/ (cwd) must win
    e.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", TQDM_DISABLE="1")
    return e


def run_dvc(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, env=env(), capture_output=True, text=True, timeout=900)


def dvc(repo: Path, *args: str) -> str:
    """`dvc <args>` in `repo`; its stdout. Fails the test with both streams' tails if it fails."""
    result = run_dvc(repo, *args)
    assert result.returncode == 0, f"dvc {' '.join(args)} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result.stdout


#: outputs whose bytes differ between runs by design: the evaluations' wall-clock seconds (stages/evaluate.py)
VARYING = "store/timings/"


def stable_lock(repo: Path) -> dict:
    """dvc.lock's stages without the timings outputs (`VARYING`: wall-clock seconds, whose hashes differ between runs):
    what two runs of the same params must agree on."""
    stages = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    for stage in stages.values():
        if "outs" in stage:
            stage["outs"] = [out for out in stage["outs"] if not out["path"].startswith(VARYING)]
    return stages


def outputs(repo: Path) -> dict[str, str]:
    """sha256 of every file of every output dvc.lock records (relative path -> digest), but the timings (`VARYING`)."""
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    paths = [repo / out["path"] for stage in lock["stages"].values() for out in stage.get("outs", []) if not out["path"].startswith(VARYING)]
    files = [f for p in paths for f in (sorted(p.rglob("*")) if p.is_dir() else [p]) if f.is_file()]
    return {f.relative_to(repo).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
