"""The CPU threads a stage computes with come from params.yaml (`threads`), never from the machine, the shell or the
batch job (stages/runner.py): every pool is set from it, and a stage writes the same bytes however many CPUs its
process was given or whatever OMP_NUM_THREADS its shell had."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stages.runner import THREAD_VARIABLES, params_threads
from tests.scratch import copy_repo, env, outputs

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text, threads", [("threads: 3\nseed: 0\n", 3), ("seed: 0\n", 1), ("threads: 0\n", 1), ("threads: true\n", 1),
                                           ("threads: '2'\n", 1), ("[1, 2]\n", 1), ("threads: [\n", 1)])
def test_the_thread_count_is_params_or_the_schemas_default_when_the_file_is_bad(tmp_path, text, threads):
    (tmp_path / "params.yaml").write_text(text)
    assert params_threads(tmp_path / "params.yaml") == threads
    assert params_threads(tmp_path / "missing.yaml") == 1


def test_every_shipped_preset_sets_threads_and_every_stage_declares_it():
    from pipeline.presets import preset_names, preset_text

    assert all(isinstance(yaml.safe_load(preset_text(name)).get("threads"), int) for name in preset_names())
    assert yaml.safe_load((ROOT / "params.yaml").read_text())["threads"] == 1
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert all("threads" in stage["params"] for stage in stages.values()), "a new thread count must rerun every stage"


PROBE = """
import json, sys
from stages.runner import parser
parser("probe").parse_args(["--params", sys.argv[1]])
import numpy, torch, threadpoolctl, os
print(json.dumps({"torch": torch.get_num_threads(), "interop": torch.get_num_interop_threads(),
                  "pools": sorted({pool["num_threads"] for pool in threadpoolctl.threadpool_info()}),
                  "env": {v: os.environ.get(v) for v in %r}}))
""" % (THREAD_VARIABLES,)


@pytest.mark.parametrize("threads", [1, 3])
def test_parsing_a_stages_arguments_sets_every_pool_from_params_whatever_the_shell_says(tmp_path, threads):
    """The probe imports torch and numpy first (as the stage modules do), in a shell that says 2 threads."""
    (tmp_path / "params.yaml").write_text(f"threads: {threads}\n")
    shell = {**env(), "PYTHONPATH": str(ROOT), **dict.fromkeys(THREAD_VARIABLES, "2")}
    out = subprocess.run([sys.executable, "-c", "import torch, numpy\n" + PROBE, str(tmp_path / "params.yaml")], env=shell, capture_output=True,
                         text=True, check=True).stdout
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen == {"torch": threads, "interop": threads, "pools": [threads], "env": dict.fromkeys(THREAD_VARIABLES, str(threads))}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2, reason="needs taskset and 2 CPUs")
def test_a_stage_writes_the_same_bytes_whatever_threads_its_shell_or_its_cpus_allow(tiny_pristine, tiny_repro, tmp_path):
    """`dvc repro encoder` (data, encoder: torch training, whose CPU results depend on the thread count) from a
    shell without thread variables (the libraries would take every CPU) writes the bytes of the session's `dvc
    repro` (a shell of OMP_NUM_THREADS=1); and `threads: 2` pinned to one CPU with OMP_NUM_THREADS=1 (a SLURM job of
    one CPU) writes other bytes: the count comes from params, not from what the process was given."""
    repo = copy_repo(tiny_pristine, tmp_path / "repo")
    every_cpu = {key: value for key, value in env().items() if key not in THREAD_VARIABLES}
    subprocess.run([sys.executable, "-m", "dvc", "repro", "encoder"], cwd=repo, env=every_cpu, check=True, capture_output=True)
    mine, reference = outputs(repo), outputs(tiny_repro)
    assert "store/encoder/model.safetensors" in mine and all(reference[path] == digest for path, digest in mine.items())
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["threads"] = 2
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    one_cpu = {**env(), "OMP_NUM_THREADS": "1"}
    subprocess.run(["taskset", "-c", "0", sys.executable, "-m", "dvc", "repro", "encoder"], cwd=repo, env=one_cpu, check=True, capture_output=True)
    assert outputs(repo)["store/encoder/model.safetensors"] != reference["store/encoder/model.safetensors"]
