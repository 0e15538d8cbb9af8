"""What a Dask worker runs for the flow: one stage's dvc.yaml commands, as `dvc repro` runs them.

Each command goes through the same shell invocation as DVC's (`dvc.stage.run`: `$SHELL` without rc files, or
/bin/sh), in the stage's directory, with `DVC_ROOT` and `DVC_STAGE` set, in the worker's environment. Nothing
about the machine reaches the results: a Dask worker sets OMP_NUM_THREADS=1 and a batch job may see one CPU, but
every stage fixes its CPU threads from params.yaml (`threads`, `stages.runner.use_threads`), so a stage on a
worker computes exactly what `dvc repro` computes anywhere.

A stage dies with its worker: a worker that is killed leaves no stage process behind to race with the retry.
The shell runs under a small supervisor (this module's `__main__`, `supervise`): on Linux the supervisor gets
SIGTERM when the worker dies (parent-death signal) and then kills the stage's whole process group, so the
stage's processes go too, whether or not the shell forks them (dash, the usual /bin/sh, does; bash execs the
last command). Only the standard library and DVC's shell helper are imported here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def _signal_me_when_my_parent_dies(signum: int) -> None:
    """Ask Linux to send `signum` to this process when the thread that started it dies (elsewhere: nothing)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signum)  # PR_SET_PDEATHSIG = 1


def supervise(parent: int, argv: list[str]) -> int:
    """Run `argv` in a new session (its own process group) and kill that whole group when the process `parent`
    (the worker) dies or this process gets SIGTERM. Returns the exit status to pass on: `argv`'s, or 128 + the
    signal that stopped the supervisor; a command killed by signal N kills the supervisor with N too."""
    child: subprocess.Popen | None = None

    def stop(signum: int, _frame) -> None:
        if child is not None:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os._exit(128 + signum)

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # no SIGTERM between starting the child and knowing it
    signal.signal(signal.SIGTERM, stop)
    _signal_me_when_my_parent_dies(signal.SIGTERM)
    child = subprocess.Popen(argv, start_new_session=True,
                             preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM}))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    if os.getppid() != parent:  # the worker died before the parent-death signal was armed
        stop(signal.SIGTERM, None)
    returncode = child.wait()
    if returncode < 0:  # die of the same signal (SIGKILL and SIGSTOP keep their default action anyway)
        if -returncode not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -returncode)
    return returncode


def run_commands(stage: str, commands: list[str], cwd: str, root: str) -> str:
    """Run `commands` in order; returns their merged stdout and stderr. RuntimeError with the output's tail on the
    first that fails."""
    from dvc.stage.run import _make_cmd, get_executable  # DVC's own shell invocation, so commands mean the same

    env = {**os.environ, "DVC_ROOT": root, "DVC_STAGE": stage}
    output = []
    for command in commands:
        supervised = [sys.executable, "-m", "flow.command", str(os.getpid()), *_make_cmd(get_executable(), command)]
        proc = subprocess.run(supervised, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        output.append(proc.stdout)
        if proc.returncode != 0:
            tail = "".join(output)[-4000:]
            how = f"was killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exited with status {proc.returncode}"
            raise RuntimeError(f"stage {stage}: `{command}` {how}\n{tail}")
    return "".join(output)


if __name__ == "__main__":
    sys.exit(supervise(int(sys.argv[1]), sys.argv[2:]))
