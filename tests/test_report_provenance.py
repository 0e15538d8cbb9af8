"""The report's provenance (stages/report.py): the git commit names uncommitted changes to the code only, and nothing
outside a git checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path

from stages.report import git_commit


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def test_git_commit_marks_uncommitted_code_but_not_the_lock(tmp_path: Path) -> None:
    assert git_commit(tmp_path) is None, "not a git checkout"
    git(tmp_path, "init", "-q")
    for name in ("pipeline/a.py", "dvc.lock"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "c")
    head = git(tmp_path, "rev-parse", "HEAD")
    assert git_commit(tmp_path) == head
    (tmp_path / "dvc.lock").write_text("changed by dvc repro\n")
    (tmp_path / "new.py").write_text("untracked\n")
    assert git_commit(tmp_path) == head, "dvc.lock and untracked files are not code changes"
    (tmp_path / "pipeline" / "a.py").write_text("x = 2\n")
    assert git_commit(tmp_path) == f"{head} + uncommitted changes"
