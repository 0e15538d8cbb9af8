"""Reliability, as a demanding user probes it, through the real CLI and DVC on the tiny preset.

- malformed params files: each refused by `cedar validate` in one line naming the file, the key and the value (fast);
- SIGKILL during each long stage, then `dvc repro` again: the outputs equal an undisturbed run's, byte for byte;
- a truncated, deleted or overwritten chunk of each kind of store, and a damaged checkpoint: detected by the stage
  or command that reads it (one line naming the store and chunk, or the file), and recovered by `dvc repro`;
- a damaged checkpoint is retrained (with a warning naming it), never reused, when its cell reruns;
- a second concurrent `dvc repro` is refused at once.
The DVC tests share the session's undisturbed run (`tiny_repro`) and work on copies of it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from cli.main import main as cli
from pipeline.presets import preset_text
from tests.scratch import copy_repo, dvc, env, outputs, run_dvc

# --- malformed params files ---------------------------------------------------------------------------------------


def tiny() -> dict:
    return yaml.safe_load(preset_text("tiny"))


def edit(change: Callable[[dict], None]) -> Callable[[Path], str]:
    """A case that changes the parsed tiny preset (the text is written back with safe_dump)."""

    def text(tmp: Path) -> str:
        raw = tiny()
        change(raw)
        return yaml.safe_dump(raw, sort_keys=False)

    return text


def put(path: str, value) -> Callable[[Path], str]:
    """A case that sets one dotted key of the tiny preset."""

    def change(raw: dict) -> None:
        *parents, last = path.split(".")
        node = raw
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return edit(change)


def text_edit(old: str, new: str) -> Callable[[Path], str]:
    """A case that edits the preset's text (what YAML itself decides: duplicate keys, broken syntax)."""

    def text(tmp: Path) -> str:
        source = preset_text("tiny")
        assert old in source
        return source.replace(old, new, 1)

    return text


def empty_image_root(tmp: Path) -> str:
    (tmp / "images" / "cats").mkdir(parents=True)
    (tmp / "images" / "cats" / "notes.txt").write_text("no images here")
    return put("data", {"source": "folders", "root": str(tmp / "images")})(tmp)


#: (case, the file's text from a scratch folder, fragments the one error line must contain: key and value)
MALFORMED: list[tuple[str, Callable[[Path], str], tuple[str, ...]]] = [
    ("negative seed", put("seed", -1), ("seed:", "-1")),
    ("boolean seed", put("seed", True), ("seed:", "True")),
    ("fractional seed", put("seed", 1.5), ("seed:", "1.5")),
    ("infinite lr", put("train.lr", float("inf")), ("train.lr:", "finite", "inf")),
    ("NaN lr", put("train.lr", float("nan")), ("train.lr:", "finite", "nan")),
    ("negative lr", put("train.lr", -0.1), ("train.lr:", "-0.1")),
    ("string lr", put("train.lr", "fast"), ("train.lr:", "'fast'")),
    ("boolean epochs", put("train.epochs", True), ("train.epochs:", "True")),
    ("zero epochs", put("train.epochs", 0), ("train.epochs:", "0")),
    ("fractional batch size", put("train.batch_size", 2.5), ("train.batch_size:", "2.5")),
    ("unknown device", put("train.device", "tpu9"), ("train.device:", "tpu9")),
    ("malformed cuda device", put("train.device", "cuda:x"), ("train.device:", "cuda:x")),
    ("warmup beyond 1", put("train.warmup_frac", 1.5), ("train.warmup_frac:", "1.5")),
    ("misspelt train key", put("train.learning_rate", 0.1), ("train.learning_rate:", "unknown key")),
    ("infinite encoder lr", put("encoder.train.lr", float("inf")), ("encoder.train.lr:", "inf")),
    ("zero embedding size", put("encoder.embed_dim", 0), ("encoder.embed_dim:", "0")),
    ("unknown encoder kind", put("encoder.kind", "vit"), ("encoder.kind: unknown kind 'vit'",)),
    ("unknown data source", put("data.source", "imagenet"), ("data.source: unknown source 'imagenet'",)),
    ("split not summing to 1", put("data.split", [0.5, 0.2, 0.2]), ("data.split:", "[0.5, 0.2, 0.2]")),
    ("empty validation split", put("data.split", [0.8, 0.0, 0.2]), ("data.split:", "[0.8, 0.0, 0.2]")),
    ("images too small", put("data.image_size", 8), ("data.image_size:", "8")),
    ("too few images of a kind", put("data.kinds.objects.n_images", 5), ("data.kinds.objects.n_images:", "5")),
    ("split too small for the evaluation", put("data.kinds.objects", {"n_images": 40, "n_pairs": 2}),
     ("data.kinds.objects.n_images:", "8 test images", "cknna_k = 10")),
    ("too many objects per scene", put("data.kinds.multi.max_objects", 12), ("data.kinds.multi.max_objects:", "12")),
    ("more pairs than test images", put("data.kinds.multi.n_pairs", 500), ("kinds.multi.n_pairs=500",)),
    ("unknown scene kind", put("data.kinds.cats", {"n_images": 50}), ("data.kinds.cats: ", "(got 'cats')")),
    ("k above the dictionary size", put("sweep.sae.ks", [4, 64]), ("sweep.sae.ks[1]:", "k=64")),
    ("rotation k above d", put("sweep.rotation.ks", [17]), ("sweep.rotation.ks[0]:", "k=17")),
    ("unknown SAE method", put("sweep.sae.methods", ["nope"]), ("sweep.sae.methods[0]:", "'nope'")),
    ("SAE swept as a rotation", put("sweep.rotation.methods", ["topk"]), ("sweep.rotation.methods[0]:", "'topk'")),
    ("empty dictionary sizes", put("sweep.sae.dict_sizes", []), ("sweep.sae.dict_sizes:", "[]")),
    ("duplicate k", put("sweep.sae.ks", [4, 4]), ("sweep.sae.ks:", "[4, 4]")),
    ("swept method without options", edit(lambda r: r["methods"].pop("topk")), ("methods.topk:", "missing")),
    ("unknown method option", put("methods.cedar.no_such_option", 1), ("methods.cedar.no_such_option:", "unknown key")),
    ("negative per-method lr", put("methods.topk.train", {"lr": -1}), ("methods.topk.train.lr:", "-1")),
    ("unknown per-method loop key", put("methods.topk.train", {"nope": 1}), ("methods.topk.train", "nope", "unknown key")),
    ("unknown method entry", put("methods.nope", {}), ("methods.nope:", "unknown method")),
    ("K above d", put("evaluate.ks", [1, 2, 32]), ("evaluate.ks[2]:", "K=32", "d=16")),
    ("caption K above d", put("explain.caption_ks", [1, 32]), ("explain.caption_ks[1]:", "K=32")),
    ("coalitions above the latents", put("evaluate.match_ks", [1, 2, 3, 20]), ("evaluate.match_ks:", "20")),
    ("TAPAS k not reported", put("evaluate.tapas_k", 9), ("evaluate:", "tapas_k=9")),
    ("zero CKNNA neighbours", put("evaluate.cknna_k", 0), ("evaluate.cknna_k:", "0")),
    ("negative threshold", put("evaluate.active_threshold", -1), ("evaluate.active_threshold:", "-1")),
    ("unknown TAPAS convention", put("evaluate.tapas_empty", "maybe"), ("evaluate.tapas_empty:", "'maybe'")),
    ("zero decoder epochs", put("captions.train.epochs", 0), ("captions.train.epochs:", "0")),
    ("planted k above its d", put("planted.ks", [99]), ("planted", "99")),
    ("zero chunk rows", put("extract.chunk_rows", 0), ("extract.chunk_rows:", "0")),
    ("numeric report title", put("report.title", 5), ("report.title:", "5")),
    ("unknown top-level key", put("trian", {"lr": 0.1}), ("trian:", "unknown key")),
    ("duplicate key", text_edit("  patience: 4\n", "  patience: 4\n  lr: 0.1\n"), (":24: train.lr:", "duplicate key", "line 22")),
    ("duplicate top-level key", text_edit("seed: 0\n", "seed: 0\nseed: 1\n"), (":4: seed:", "duplicate key", "line 3")),
    ("broken YAML", text_edit("  batch_size: 64\n  epochs: 4", "  batch_size: [64\n  epochs: 4"), (":20:9: not valid YAML", "line 19")),
    ("tab indentation", text_edit("  epochs: 4\n", "\tepochs: 4\n"), (":20:1: not valid YAML", "'\\t'")),
    ("a list, not a mapping", lambda tmp: "- seed: 0\n", ("expected a mapping at the top level", "list")),
    ("empty file", lambda tmp: "", ("expected a mapping at the top level", "NoneType")),
    ("missing image root", put("data", {"source": "folders", "root": "/nonexistent/images"}), ("data", "/nonexistent/images", "no such")),
    ("image root without images", empty_image_root, ("data", "images", "no image files")),
    ("hub model not cached offline", put("encoder", {"kind": "hf_clip", "model": "openai/clip-vit-base-patch32"}),
     ("encoder.model:", "'openai/clip-vit-base-patch32'", "not in the local cache", "run once with network access")),
    ("open_clip tag not cached offline", put("encoder", {"kind": "open_clip", "arch": "ViT-B-32", "weights": "laion2b_s34b_b79k"}),
     ("encoder.weights:", "'laion2b_s34b_b79k'", "not in the local cache")),
    ("missing open_clip weights file", put("encoder", {"kind": "open_clip", "arch": "ViT-B-32", "weights": "/nonexistent/w.safetensors"}),
     ("encoder.weights:", "/nonexistent/w.safetensors", "no such checkpoint file")),
    ("pretrained model without id", put("encoder", {"kind": "dinov2"}), ("encoder", "dinov2 needs `model`")),
]


@pytest.mark.parametrize("case,text,fragments", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_a_malformed_params_file_is_refused_in_one_line_naming_file_key_and_value(case, text, fragments, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = tmp_path / "params.yaml"
    path.write_text(text(tmp_path))
    assert cli(["validate", str(path)]) == 2, case
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and captured.out == "", f"{case}: {captured.err}"
    assert lines[0].startswith(f"error: {path}"), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], f"{case}: {fragment!r} not in {lines[0]!r}"


def test_the_table_has_at_least_40_cases():
    assert len(MALFORMED) >= 40 and len({c[0] for c in MALFORMED}) == len(MALFORMED)


@pytest.mark.slow
def test_dvc_repro_without_params_yaml_says_so_in_one_line(tiny_repro, tmp_path):
    repo = copy_repo(tiny_repro, tmp_path / "repo")
    (repo / "params.yaml").unlink()
    result = run_dvc(repo, "repro")
    assert result.returncode != 0
    errors = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("ERROR")]
    assert errors == ["ERROR: failed to parse 'vars' in 'dvc.yaml': 'params.yaml' does not exist"], result.stderr


@pytest.mark.slow
def test_a_stage_refuses_a_malformed_params_file_before_any_work(tiny_repro, tmp_path):
    repo = copy_repo(tiny_repro, tmp_path / "repo")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"]["device"] = "tpu9"
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    result = run_dvc(repo, "repro")
    assert result.returncode != 0
    assert "error: cell: params.yaml: train.device: unknown device 'tpu9'" in result.stderr
    assert "Traceback" not in result.stderr


# --- SIGKILL during each long stage -----------------------------------------------------------------------------


HOOKS = Path(__file__).parent / "hooks"  # sitecustomize.py: pauses a training after an epoch checkpoint


def repro_killed_when(repo: Path, marker: Callable[[str], bool], delay: float = 0.0, timeout: float = 600,
                      extra_env: dict[str, str] | None = None) -> str:
    """Run `dvc repro` in `repo` (with `extra_env` added to its environment) and SIGKILL it (DVC and the stage it
    runs: the whole process group) as soon as `marker(log so far)` holds, after `delay` seconds; returns the log.
    Fails if the run ends first."""
    log_path = repo.parent / f"repro-{time.monotonic_ns()}.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "dvc", "repro"], cwd=repo, env=env() | (extra_env or {}), stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    while not marker(log_path.read_text()):
        assert process.poll() is None, f"dvc repro ended before it could be killed:\n{log_path.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "marker never seen"
        time.sleep(0.02)
    time.sleep(delay)
    assert process.poll() is None, f"dvc repro ended before it could be killed:\n{log_path.read_text()[-3000:]}"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    return log_path.read_text()


def logged(pattern: str) -> Callable[[str], bool]:
    return lambda text: re.search(pattern, text) is not None


def exists(repo: Path, relative: str) -> Callable[[str], bool]:
    return lambda text: (repo / relative).exists()


def paused(flag: Path) -> Callable[[str], bool]:
    return lambda text: flag.exists()


#: (stage, what shows it is in the middle of its work, extra seconds before the kill); None: the test's own marker
KILLS = [
    ("data", "objects rendered, writing", logged(r"objects: rendered"), 0.0),
    ("encoder", "training, after epoch 1", logged(r"embedded model epoch 1:"), 0.0),
    ("extract", "embedding, outputs half-built in store/embeddings.tmp", None, 0.0),
    ("captions", "training, after epoch 3", logged(r"caption decoder epoch 3:"), 0.0),
    ("rotation@cedar-4", "training, paused by tests/hooks after its first epoch checkpoint", None, 0.0),
    ("sae@topk-32-4", "evaluating, model trained", logged(r"topk-32-4: trained in"), 0.5),
    ("planted", "benchmarking, first method done", logged(r"planted d=\d+ k=\d+ noise=\S+ cedar"), 0.0),
    ("report", "writing the report", logged(r"Running stage 'report'"), 3.0),
]


@pytest.mark.slow
def test_sigkill_during_each_long_stage_then_rerun_gives_the_undisturbed_outputs(tiny_repro, tmp_path):
    """From an empty store, `dvc repro` is killed once in the middle of every long stage, in pipeline order (each
    rerun resumes from what the kills left); the run that finally completes equals the undisturbed one."""
    repo = copy_repo(tiny_repro, tmp_path / "repo")
    for name in ("store", "reports", ".dvc/cache"):  # the cache too: DVC would restore the outputs from its run-cache
        shutil.rmtree(repo / name)
    (repo / "dvc.lock").unlink()
    logs = {}
    flag = tmp_path / "paused"
    for stage, moment, marker, delay in KILLS:
        extra_env = {}
        if stage == "extract":  # the first store finished, the rest pending
            marker = exists(repo, "store/embeddings.tmp/images.zarr")
        if stage == "rotation@cedar-4":  # a tiny training lasts 0.05 s: a kill aimed at a log line cannot land inside it
            marker = paused(flag)
            extra_env = {"PYTHONPATH": str(HOOKS), "CEDAR_TEST_PAUSE_RUN": "cedar-4", "CEDAR_TEST_PAUSE_FLAG": str(flag)}
        logs[stage] = repro_killed_when(repo, marker, delay, extra_env=extra_env)
        running = re.findall(r"Running stage '([^']+)'", logs[stage])
        assert running and running[-1] == stage, f"killed in {running[-1:]}, not in {stage} ({moment})"
    final = run_dvc(repo, "repro")
    assert final.returncode == 0, final.stderr[-4000:]
    assert "images.zarr: already complete, kept" in logs["captions"], "the rerun of extract keeps the store finished before the kill"
    later = "".join(logs[stage] for stage, *_ in KILLS[[k[0] for k in KILLS].index("rotation@cedar-4") + 1 :]) + final.stdout + final.stderr
    assert "cedar: resuming after epoch" in later, "the rerun of the cedar cell (whichever run DVC orders it in) resumes from its epoch checkpoint"
    assert outputs(repo) == outputs(tiny_repro), "the outputs after the kills differ from an undisturbed run"
    assert json.loads(dvc(repo, "status", "--json")) == {}
    leftovers = [p.name for p in (repo / "store").rglob("*") if p.name.endswith((".tmp", ".partial", ".old", ".final"))]
    assert leftovers == [], f"a finished run leaves no work folders: {leftovers}"



# --- damaged stores and checkpoints -------------------------------------------------------------------------------

DAMAGES = ("truncate", "delete", "overwrite")


def damage(path: Path, how: str) -> None:
    """truncate: keep the first half; delete; overwrite: same size, the second half set to bytes 0x07 (finite float32
    values; a safetensors file keeps its header, so only its digest can tell)."""
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif how == "delete":
        path.unlink()
    else:
        half = len(data) // 2
        path.write_bytes(data[:half] + np.full(len(data) - half, 7, np.uint8).tobytes())


def run_extract(repo: Path) -> int:
    from stages.extract import main

    return main(["--params", str(repo / "params.yaml"), "--root", str(repo)])


def run_cell(repo: Path) -> int:
    from stages.cell import main

    return main(["--params", str(repo / "params.yaml"), "--root", str(repo), "--method", "topk", "--size", "32", "--k", "4"])


def run_explain(repo: Path) -> int:
    image = repo.parent / "image.png"
    Image.fromarray(np.full((32, 32, 3), 90, np.uint8)).save(image)
    return cli(["explain", str(image), "--run", "topk-32-4", "--params", str(repo / "params.yaml"), "--root", str(repo)])


#: (what, the file damaged, a command that reads it, what its one error line names)
TARGETS = [
    ("dataset image store", "store/data/images.zarr/c/0/0/0/0", run_extract, "store/data/images.zarr: chunk c/0/0/0/0 is"),
    ("image embedding store", "store/embeddings/images.zarr/c/0/0", run_cell, "store/embeddings/images.zarr: chunk c/0/0 is"),
    ("concept embedding store", "store/embeddings/concepts.zarr/c/0/0", run_explain, "store/embeddings/concepts.zarr: chunk c/0/0 is"),
    ("sparse model checkpoint", "store/models/topk-32-4/model.safetensors", run_explain, "store/models/topk-32-4/model.safetensors"),
    ("caption decoder", "store/captions/model.safetensors", run_cell, "store/captions"),
    ("embedded encoder", "store/encoder/model.safetensors", run_extract, "store/encoder/model.safetensors"),
]


@pytest.mark.slow
@pytest.mark.parametrize("shift", range(len(DAMAGES)), ids=[f"round{i}" for i in range(len(DAMAGES))])
def test_damaged_stores_and_checkpoints_are_named_by_their_reader_and_recovered_by_dvc_repro(tiny_repro, tmp_path, capsys, shift):
    """Round `shift` gives target i the damage DAMAGES[(i + shift) % 3]: over the three rounds every kind of store
    and checkpoint is truncated, deleted and overwritten once. Each damage alone: the command that reads the file
    fails with one line naming it (the chunk, for a store); all of them together: `dvc repro` restores the
    undisturbed outputs."""
    repo = copy_repo(tiny_repro, tmp_path / "repo")
    plan = [(what, repo / relative, reader, named, DAMAGES[(i + shift) % len(DAMAGES)]) for i, (what, relative, reader, named) in enumerate(TARGETS)]
    for what, path, reader, named, how in plan:
        original = path.read_bytes()
        damage(path, how)
        capsys.readouterr()
        assert reader(repo) == 2, f"{what} ({how}): the reader did not fail"
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in err, f"{what} ({how}): {err[-2000:]}"
        assert f"{repo}/{named}" in errors[0], f"{what} ({how}): {errors[0]}"
        path.write_bytes(original)
    for _, path, _, _, how in plan:
        damage(path, how)
    dvc(repo, "repro")
    assert outputs(repo) == outputs(tiny_repro), "dvc repro did not restore the undisturbed outputs"
    assert json.loads(dvc(repo, "status", "--json")) == {}


@pytest.mark.slow
def test_a_damaged_checkpoint_is_retrained_with_a_warning_when_its_cell_reruns(tiny_repro, tmp_path):
    """The probe's case: evaluation params change, so every cell reruns and would reuse its model. A checkpoint
    whose tensors became other finite numbers (topk-32-4) and one whose header broke (cedar-4) are retrained, each
    with a warning naming it, into the undisturbed models, byte for byte."""
    repo = copy_repo(tiny_repro, tmp_path / "repo")
    damage(repo / "store/models/topk-32-4/model.safetensors", "overwrite")
    weights = repo / "store/models/cedar-4/model.safetensors"
    weights.write_bytes(b"\xff" * 8 + weights.read_bytes()[8:])
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["evaluate"]["ks"] = [1, 2, 3, 4, 8, 16]
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    result = run_dvc(repo, "repro")
    assert result.returncode == 0, result.stderr[-4000:]
    for run in ("topk-32-4", "cedar-4"):
        assert re.search(rf"store/models/{run}: checkpoint cannot be reused \(.*store/models/{run}/model.safetensors: weights differ", result.stderr)
        assert f"{run}: trained in" in result.stderr
        ours, undisturbed = (outputs(r) for r in (repo, tiny_repro))
        model = {k: v for k, v in ours.items() if k.startswith(f"store/models/{run}/")}
        assert model and model == {k: v for k, v in undisturbed.items() if k.startswith(f"store/models/{run}/")}
    assert "reusing" not in result.stderr


@pytest.mark.slow
def test_a_second_concurrent_dvc_repro_is_refused_at_once(tiny_repro, tmp_path):
    """While one `dvc repro` runs a stage, a second one stops, without running anything, at the first stage whose
    outputs the first holds, and names the process that holds them."""
    repo = copy_repo(tiny_repro, tmp_path / "repo")
    log_path = tmp_path / "first.log"
    with open(log_path, "w") as log:
        first = subprocess.Popen([sys.executable, "-m", "dvc", "repro", "--force", "planted"], cwd=repo, env=env(), stdout=log,
                                 stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while "Running stage 'planted'" not in log_path.read_text():
        assert first.poll() is None and time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.05)
    start = time.monotonic()
    second = run_dvc(repo, "repro")
    elapsed = time.monotonic() - start
    still_running = first.poll() is None
    assert first.wait(timeout=600) == 0, log_path.read_text()[-3000:]
    assert still_running, "the first run ended before the second started: nothing was concurrent"
    # DVC's lock on the stage's outputs: "'.../planted.json' is busy, it is being blocked by: (PID n): ... repro ..."
    assert second.returncode != 0 and "is busy, it is being blocked by" in second.stderr, second.stderr
    assert "Running stage" not in second.stdout, "the second run did work"
    assert elapsed < 30, f"the second run took {elapsed:.0f} s instead of refusing at once"
    assert outputs(repo) == outputs(tiny_repro)
