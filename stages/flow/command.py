"""What a Dask worker runs for the flow: one stage's dvc.yaml commands, as `dvc repro` runs them.

Each command goes through the same shell invocation as DVC's (`dvc.stage.run`: `$SHELL` without rc files, or
/bin/sh), in the stage's directory, with `DVC_ROOT` and `DVC_STAGE` set. The environment is the worker's, except
for the CPU thread counts: the flow passes those from the machine that started it (or the cluster's `threads`),
because a Dask worker process sets OMP_NUM_THREADS=1 and torch's results on CPU depend on its thread count;
so a stage on a worker computes exactly what `dvc repro` computes from the same shell.

On Linux the command dies with the worker (parent-death signal): a worker that is killed leaves no stage
process behind to race with the retry. Only the standard library and DVC's shell helper are imported here.
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


def _die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGKILL it when the thread that started it dies."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1


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
        proc = subprocess.run(_make_cmd(get_executable(), command), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, errors="replace", preexec_fn=_die_with_parent)
        output.append(proc.stdout)
        if proc.returncode != 0:
            tail = "".join(output)[-4000:]
            how = f"was killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exited with status {proc.returncode}"
            raise RuntimeError(f"stage {stage}: `{command}` {how}\n{tail}")
    return "".join(output)
