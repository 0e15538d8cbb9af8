"""pipeline.models.checkpoint and pipeline.training.resume: weight files are checked against their recorded digest,
so a damaged file is an error naming it (final checkpoints) or is discarded with a warning (epoch checkpoints)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pipeline.models.checkpoint import CheckpointError, load_model, load_weights, save_model, save_weights
from pipeline.models.registry import build
from pipeline.training.loop import TrainState, make_optimizer
from pipeline.training.resume import load_resume, save_resume


def garble(path, how: str) -> None:
    data = path.read_bytes()
    if how == "overwrite":  # same size, finite float32 values (bytes 0x07), header kept
        path.write_bytes(data[: len(data) // 2] + bytes([7]) * (len(data) - len(data) // 2))
    elif how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif how == "header":
        path.write_bytes(b"\xff" * 8 + data[8:])
    else:
        path.unlink()


def test_weights_round_trip_and_their_digest_is_the_files(tmp_path):
    tensors = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(4)}
    digest = save_weights(tensors, tmp_path / "w.safetensors")
    assert not list(tmp_path.glob("*.tmp")), "written under a temporary name and renamed"
    loaded = load_weights(tmp_path / "w.safetensors", digest)
    assert set(loaded) == {"a", "b"} and torch.equal(loaded["a"], tensors["a"])
    assert save_weights(tensors, tmp_path / "v.safetensors") == digest, "same tensors, same bytes"


@pytest.mark.parametrize("how", ["overwrite", "truncate", "header", "delete"])
def test_a_damaged_weight_file_is_an_error_naming_it(tmp_path, how):
    model = build("topk", 4, 8, 2, seed=0)
    save_model(model, tmp_path)
    garble(tmp_path / "model.safetensors", how)
    message = "weights missing" if how == "delete" else "weights differ from the digest"
    with pytest.raises(CheckpointError, match=f"{tmp_path}/model.safetensors: {message}"):
        load_model(tmp_path)


def test_an_intact_checkpoint_loads_the_same_model(tmp_path):
    model = build("topk", 4, 8, 2, seed=0)
    save_model(model, tmp_path, {"fingerprint": "f"})
    config = json.loads((tmp_path / "config.json").read_text())
    assert len(config["weights_digest"]) == 16 and config["provenance"] == {"fingerprint": "f"}
    x = torch.randn(5, 4)
    torch.testing.assert_close(load_model(tmp_path)(x), model.eval()(x))


def resumable(seed: int = 0):
    torch.manual_seed(seed)
    model = build("topk", 4, 8, 2, seed=seed)
    return model, make_optimizer(model, lr=1e-2, weight_decay=0.0)


def test_a_kill_between_an_epochs_weights_and_its_record_resumes_from_the_previous_epoch(tmp_path):
    """Killed while epoch 3's checkpoint is written (its weight file half there, resume.json not yet replaced): the
    checkpoint of epoch 2 is still whole and is what a rerun resumes from; once epoch 3's record lands, epoch 2's
    weights are gone."""
    model, optimizer = resumable()
    best = {k: v.clone() for k, v in model.state_dict().items()}
    save_resume(tmp_path, model, optimizer, TrainState(epoch=2, step=10), best, fingerprint="f")
    (tmp_path / "resume-3.safetensors").write_bytes(b"half a file")
    restored, restored_optimizer = resumable(seed=1)
    assert load_resume(tmp_path, restored, restored_optimizer, "f")[0].epoch == 2
    save_resume(tmp_path, model, optimizer, TrainState(epoch=3, step=15), best, fingerprint="f")
    assert sorted(f.name for f in tmp_path.glob("resume-*")) == ["resume-3.safetensors"]
    assert load_resume(tmp_path, restored, restored_optimizer, "f")[0].epoch == 3


@pytest.mark.parametrize("how", ["overwrite", "truncate", "header", "delete", "json", "other_inputs"])
def test_an_unusable_epoch_checkpoint_is_discarded_with_a_warning(tmp_path, how, caplog):
    model, optimizer = resumable()
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    best = {k: v.clone() for k, v in model.state_dict().items()}
    save_resume(tmp_path, model, optimizer, TrainState(epoch=2, step=10), best, fingerprint="f")
    restored, restored_optimizer = resumable(seed=1)
    assert load_resume(tmp_path, restored, restored_optimizer, "f")[0].epoch == 2
    for a, b in zip(model.state_dict().values(), restored.state_dict().values()):
        torch.testing.assert_close(a, b)
    if how == "json":
        (tmp_path / "resume.json").write_text("{broken")
    elif how != "other_inputs":
        garble(tmp_path / "resume-2.safetensors", how)
    fresh, fresh_optimizer = resumable(seed=1)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with caplog.at_level("INFO", logger="pipeline.training.resume"):
        assert load_resume(tmp_path, fresh, fresh_optimizer, "g" if how == "other_inputs" else "f") is None
    assert all(torch.equal(before[k], v) for k, v in fresh.state_dict().items()), "a discarded checkpoint changes nothing"
    assert ("other inputs" if how == "other_inputs" else "epoch checkpoint unusable") in caplog.text
    assert np.isfinite(sum(float(v.sum()) for v in fresh.state_dict().values()))


@pytest.mark.parametrize("best_epoch", [2, 1])
def test_the_best_weights_are_stored_once_when_they_are_the_models_and_apart_otherwise(tmp_path, best_epoch):
    from safetensors import safe_open

    from pipeline.training.resume import Checkpoints

    model, optimizer = resumable(0)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    best = {k: v.clone() for k, v in model.state_dict().items()} if best_epoch == 2 else {k: v + 1 for k, v in model.state_dict().items()}
    checkpoints = Checkpoints(tmp_path, "f")  # the background writer the training stage uses
    checkpoints.save(model, optimizer, TrainState(epoch=2, step=10, best_epoch=best_epoch), best)
    with torch.no_grad():  # the live model moves on while the snapshot is written
        next(model.parameters()).add_(5)
    checkpoints.close()
    with safe_open(str(tmp_path / "resume-2.safetensors"), "pt") as f:
        stored = set(f.keys())
    assert any(k.startswith("best/") for k in stored) == (best_epoch != 2), "one copy when the best epoch is this one"
    restored, restored_optimizer = resumable(1)
    state, restored_best = load_resume(tmp_path, restored, restored_optimizer, "f")
    assert state.best_epoch == best_epoch
    for key, value in best.items():
        torch.testing.assert_close(restored_best[key], value, rtol=0, atol=0)
    torch.testing.assert_close(next(restored.parameters()) + 5, next(model.parameters()), rtol=0, atol=0)
