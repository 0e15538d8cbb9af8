"""What a Dask worker runs for the flow: one stage's dvc.yaml commands, as `dvc repro` runs them.

Each command goes through the same shell invocation as DVC's (`dvc.stage.run`: `$SHELL` without rc files, or
/bin/sh), in the stage's directory, with `DVC_ROOT` and `DVC_STAGE` set. The environment is the worker's, except
for the CPU thread counts: the flow passes those from the machine that started it (or the cluster's `threads`),
because a Dask worker process sets OMP_NUM_THREADS=1 and torch's results on CPU depend on its thread count;
so a stage on a worker computes exactly what `dvc repro` computes from the same shell.

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

#: the environment variables that set the CPU threads of torch, numpy and their BLAS libraries
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def thread_environment(threads: int | None) -> dict[str, str | None]:
    """The thread variables a stage runs with: `threads` for all, or (None) those of this process, an unset one
    staying unset (what `dvc repro` from this shell would give the stage)."""
    return {var: str(threads) if threads is not None else os.environ.get(var) for var in THREAD_VARIABLES}


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


def run_commands(stage: str, commands: list[str], cwd: str, root: str, environment: dict[str, str | None]) -> str:
    """Run `commands` in order; returns their merged stdout and stderr. RuntimeError with the output's tail on the
    first that fails. environment: variables to set (None: to unset) over the worker's own."""
    from dvc.stage.run import _make_cmd, get_executable  # DVC's own shell invocation, so commands mean the same

    env = {**os.environ, "DVC_ROOT": root, "DVC_STAGE": stage}
    for key, value in environment.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
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
