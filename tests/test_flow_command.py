"""What a worker runs for a stage (flow/command.py): the dvc.yaml commands through DVC's shell, their
output, a clear error on failure, and a stage that dies with its worker, whatever the shell forks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from flow.command import run_commands

ROOT = Path(__file__).resolve().parents[1]


def test_the_commands_run_in_order_in_the_stage_directory_with_dvcs_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("SHELL", "/bin/sh")
    monkeypatch.setenv("MARK", "the worker's")
    out = run_commands("s", ["echo one $DVC_STAGE", "pwd", "echo $DVC_ROOT $MARK"], str(tmp_path), "/root/of/it")
    assert out.splitlines() == ["one s", str(tmp_path), "/root/of/it the worker's"]


def test_a_failing_command_names_the_stage_the_command_and_its_output(tmp_path, monkeypatch):
    monkeypatch.setenv("SHELL", "/bin/sh")
    with pytest.raises(RuntimeError, match=r"stage s: `echo boom; exit 3` exited with status 3\nboom"):
        run_commands("s", ["echo boom; exit 3", "echo never"], str(tmp_path), str(tmp_path))
    with pytest.raises(RuntimeError, match="was killed by signal 9"):
        run_commands("s", ["kill -9 $$"], str(tmp_path), str(tmp_path))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_every_process_of_a_stage_dies_with_the_worker_even_those_the_shell_forked(tmp_path):
    """/bin/sh (dash) forks even the last command, so the stage's python is the worker's grandchild: killing the
    worker must take the shell, the background job and the foreground command with it."""
    worker = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(ROOT)!r})
        os.environ["SHELL"] = "/bin/sh"
        from flow.command import run_commands
        run_commands("s", ["sleep 61 & sleep 62"], {str(tmp_path)!r}, {str(tmp_path)!r})
    """)])
    deadline = time.time() + 30
    while time.time() < deadline:
        stage = psutil.Process(worker.pid).children(recursive=True)
        if sleeps(stage) == ["61", "62"]:
            break
        time.sleep(0.05)
    assert sleeps(stage) == ["61", "62"]
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    gone, alive = psutil.wait_procs(stage, timeout=10)
    assert alive == [], [p.cmdline() for p in alive]


def sleeps(processes: list[psutil.Process]) -> list[str]:
    """The arguments of the `sleep` processes among `processes`, sorted. A process caught between the shell's fork and
    its exec is named `sleep` with an empty command line for a moment (seen in CI): it counts once it has one."""
    found = []
    for process in processes:
        try:
            command = process.cmdline() if process.name() == "sleep" else []
        except psutil.NoSuchProcess:
            continue
        if command:
            found.append(command[-1])
    return sorted(found)
