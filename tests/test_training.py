"""pipeline.training: the one loop (schedule, early stopping, resume) on a tiny sparse model defined here, and the
same loop driving a module that is not a sparse model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor

from pipeline.models.base import SparseModel, array_io
from pipeline.training.loop import TrainState, array_batches, fit
from pipeline.training.options import TrainSettings
from pipeline.training.schedule import lr_factor
from pipeline.training.sparse import fit_array, train_sparse


class TinyTopK(SparseModel):
    """A linear top-k autoencoder: the smallest model that exercises every hook of the interface."""

    method = "tiny"

    def __init__(self, d: int, n_latents: int, k: int) -> None:
        super().__init__(d, n_latents, k)
        self.enc = torch.nn.Parameter(torch.randn(n_latents, d) * 0.3)
        self.dec = torch.nn.Parameter(self.enc.detach().clone())
        self.register_buffer("mean", torch.zeros(d))
        self.calls: list[str] = []

    def fit_init(self, x: Tensor) -> None:
        self.mean.copy_(x.mean(0))

    @array_io
    def encode(self, x: Tensor, k: int | None = None) -> Tensor:
        pre = torch.relu((x - self.mean) @ self.enc.T)
        top = pre.topk(k or self.k, dim=1)
        return torch.zeros_like(pre).scatter(1, top.indices, top.values)

    @array_io
    def decode(self, codes: Tensor) -> Tensor:
        return codes @ self.dec + self.mean

    def training_loss(self, x, progress, generator):
        codes = self.encode(x)
        loss = ((self.decode(codes) - x) ** 2).sum(1).mean()
        return loss, {"l0": (codes != 0).float().sum(1).mean().detach()}

    def before_step(self) -> None:
        self.calls.append("before")

    def after_step(self) -> None:
        self.calls.append("after")


def planted(n: int = 600, d: int = 8, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    basis = rng.normal(size=(4, d))
    return (rng.random((n, 4)) * (rng.random((n, 4)) < 0.5)) @ basis + 0.01 * rng.normal(size=(n, d))


def test_lr_factor_warms_up_linearly_then_decays_to_the_floor():
    assert lr_factor(0, 100, 0.1, 0.1) == pytest.approx(0.1)
    assert lr_factor(9, 100, 0.1, 0.1) == pytest.approx(1.0)
    assert lr_factor(10, 100, 0.1, 0.1) == pytest.approx(1.0)
    assert lr_factor(100, 100, 0.1, 0.1) == pytest.approx(0.1)
    values = [lr_factor(s, 100, 0.1, 0.1) for s in range(10, 101)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_array_batches_cover_every_row_once_per_epoch():
    x = np.arange(10, dtype=np.float32)[:, None]
    source = array_batches(x, 3, seed=1)
    assert sorted(np.concatenate(list(source(0)))[:, 0].tolist()) == list(range(10))
    assert not np.array_equal(np.concatenate(list(source(0))), np.concatenate(list(source(1))))


def test_training_lowers_validation_fvu_and_calls_hooks_in_order():
    torch.manual_seed(0)
    model = TinyTopK(8, 16, 4)
    result = fit_array(model, planted(), TrainSettings(batch_size=64, epochs=15, min_steps=0, lr=1e-2, patience=20))
    fvus = [h["val_fvu"] for h in result.history]
    assert fvus[-1] < 0.5 * fvus[0]
    assert model.calls[:4] == ["before", "after", "before", "after"]
    assert {"train_loss", "train_l0", "val_l0", "val_dead_fraction"} <= set(result.history[0])


def test_early_stopping_restores_the_best_epoch():
    torch.manual_seed(0)
    model = TinyTopK(8, 16, 4)
    result = fit_array(model, planted(), TrainSettings(batch_size=64, epochs=40, min_steps=0, lr=0.5, patience=2))
    best = min(h["val_fvu"] for h in result.history)
    assert result.history[result.best_epoch - 1]["val_fvu"] == best
    if result.stopped_early:
        assert len(result.history) == result.best_epoch + 2


def test_resumed_run_equals_uninterrupted_run():
    x = planted().astype(np.float32)
    train, val = x[:500], x[500:]
    settings = TrainSettings(batch_size=64, epochs=6, min_steps=0, lr=1e-2, patience=10)
    steps = -(-len(train) // settings.batch_size)

    def fresh() -> TinyTopK:
        torch.manual_seed(0)
        return TinyTopK(8, 16, 4)

    whole = train_sparse(fresh(), array_batches(train, 64, 0), steps, train, val, settings, 0)

    saved: dict = {}

    def save(model, optimizer, state, best):
        if state.epoch == 3:
            saved.update(model=copy_state(model.state_dict()), opt=optimizer.state_dict(), state=TrainState(**vars(state)), best=copy_state(best))
            raise KeyboardInterrupt  # the "kill" after epoch 3

    def copy_state(state):
        return {k: v.clone() for k, v in state.items()}

    with pytest.raises(KeyboardInterrupt):
        train_sparse(fresh(), array_batches(train, 64, 0), steps, train, val, settings, 0, save_state=save)

    def load(model, optimizer):
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["opt"])
        return saved["state"], saved["best"]

    resumed = train_sparse(fresh(), array_batches(train, 64, 0), steps, train, val, settings, 0, load_state=load)
    assert [h["val_fvu"] for h in resumed.history] == pytest.approx([h["val_fvu"] for h in whole.history], rel=1e-6)
    for a, b in zip(whole.module.state_dict().values(), resumed.module.state_dict().values()):
        torch.testing.assert_close(a, b)


def test_fit_array_rejects_bad_input():
    with pytest.raises(ValueError, match=r"shape \(n, 8\)"):
        fit_array(TinyTopK(8, 16, 4), np.zeros((10, 3)), TrainSettings())
    bad = planted()
    bad[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        fit_array(TinyTopK(8, 16, 4), bad, TrainSettings())


def test_model_rejects_impossible_k():
    with pytest.raises(ValueError, match="1 <= k <= n_latents"):
        TinyTopK(8, 4, 5)


def test_epochs_the_model_finds_unacceptable_are_never_restored(caplog):
    class Picky(TinyTopK):
        def acceptable(self, val_l0: float) -> bool:
            return False

    torch.manual_seed(0)
    with caplog.at_level("WARNING", logger="pipeline.training.sparse"):
        result = fit_array(Picky(8, 16, 4), planted(), TrainSettings(batch_size=64, epochs=3, min_steps=0, lr=1e-2, patience=10))
    assert result.best_epoch == -1 and len(result.history) == 3
    assert "no epoch met the model's sparsity target" in caplog.text


class Quadratic(torch.nn.Module):
    """Not a sparse model: a vector fitted to the batch means, to show the loop drives any `Trainable`."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(3))
        self.steps = 0

    def training_loss(self, batch, progress, generator):
        x, weight = batch
        return ((x - self.w) ** 2 * weight).sum(1).mean(), {"progress": torch.tensor(progress)}

    def before_step(self) -> None:
        pass

    def after_step(self) -> None:
        self.steps += 1


def test_the_loop_trains_any_trainable_on_tuple_batches_and_reports_its_stats():
    rng = np.random.default_rng(0)
    x = rng.normal(loc=[1.0, -2.0, 0.5], scale=0.1, size=(256, 3)).astype(np.float32)
    weight = np.ones((256, 1), dtype=np.float32)

    def batches(epoch):
        order = np.random.default_rng([0, epoch]).permutation(256)
        for start in range(0, 256, 32):
            rows = order[start:start + 32]
            yield x[rows], weight[rows]

    module = Quadratic()
    result = fit(module, batches, 8, TrainSettings(epochs=40, min_steps=0, lr=0.1, min_lr_frac=0.0, grad_clip=0.0), seed=0)
    assert module.steps == 320 and result.best_epoch == 40 and not result.stopped_early
    np.testing.assert_allclose(module.w.detach().numpy(), x.mean(0), atol=0.05)
    assert result.history[0]["train_progress"] == pytest.approx(np.mean(np.arange(8) / 320))
    assert result.history[-1]["lr"] == pytest.approx(0.0, abs=1e-12)
    assert result.history[-1]["train_loss"] < 0.1 * result.history[0]["train_loss"]


def test_the_loop_leaves_the_global_rng_as_it_was():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    fit(Quadratic(), lambda epoch: iter([(np.zeros((4, 3), np.float32), np.ones((4, 1), np.float32))]), 1, TrainSettings(epochs=2, min_steps=0), seed=5)
    torch.testing.assert_close(torch.rand(3), expected)


def test_train_settings_refuse_bad_values_naming_the_field():
    for kwargs, field in [({"lr": 0}, "lr"), ({"epochs": True}, "epochs"), ({"lr": float("inf")}, "lr"), ({"device": "tpu9"}, "device"),
                          ({"warmup_frac": 1.5}, "warmup_frac")]:
        with pytest.raises(ValueError, match=field):
            TrainSettings(**kwargs)


def test_the_budget_rule_by_hand():
    from pipeline.training.schedule import Plan, plan

    # 87 epochs = 2001 steps; 0.5 / sqrt(2001) = 0.0112 -> 1e-2; min_steps asked for 2000 / 2001 of them
    assert plan(20, 2000, None, "auto", 23) == Plan(87, 2001, 0.01, 2000 / 2001)
    assert plan(20, 2000, None, 5e-4, 23) == Plan(87, 2001, 5e-4, 2000 / 2001)  # an explicit rate is kept
    budget = plan(50, 0, None, "auto", 5000)  # ImageNet-sized: the epochs decide, lr = 0.5 / sqrt(250,000) = 1e-3
    assert (budget.epochs, budget.steps, budget.guaranteed) == (50, 250_000, 0.0) and budget.lr == pytest.approx(1e-3)
    assert plan(50, 2000, None, "auto", 5000).guaranteed == pytest.approx(2000 / 250_000), "early stopping may act beyond min_steps"
    assert plan(200, 0, None, "auto", 5000).lr == pytest.approx(5e-4)  # a million steps: the published SAE rate
    assert plan(3, 0, None, "auto", 1) == Plan(3, 3, 0.01)
    # a cap wins over min_steps: 100 steps of 23 a epoch = 5 epochs started, lr 0.5 / sqrt(100) = 0.05 -> 1e-2
    assert plan(20, 2000, 100, "auto", 23) == Plan(5, 100, 0.01, 1.0)
    assert plan(1, 0, 10_000, "auto", 23) == Plan(1, 23, 0.01), "a cap above the budget changes nothing"


def test_early_stopping_waits_for_the_guaranteed_steps():
    """min_steps = 600 on 1 epoch = 10 steps: 60 epochs, all of them trained although the validation FVU stops
    improving long before (patience 2); with min_steps 0 the same run stops early."""
    x = planted().astype(np.float32)
    for min_steps, expect_all in ((600, True), (0, False)):
        torch.manual_seed(0)
        result = fit_array(TinyTopK(8, 16, 4), x, TrainSettings(batch_size=54, epochs=60, min_steps=min_steps, lr=0.05, patience=2))
        assert (len(result.history) == 60) == expect_all and result.stopped_early != expect_all, (min_steps, len(result.history))


def test_defaults_train_a_topk_sae_to_within_twice_the_oracle_on_planted_data():
    """The library defaults on small data (d 32, k 4, dictionary 2d, noise 0.1): the budget rule's 2,000 steps at
    lr 1e-2 (bench/bench_training_budget.py has every method; the old 460 steps at 5e-4 ended 18x above)."""
    from dataclasses import replace

    from pipeline.data.planted import planted as planted_data
    from pipeline.metrics.reconstruction import fvu
    from pipeline.scoring.planted import oracle_fvu
    from pipeline.training.sparse import fit_sae

    data = planted_data(8000, 32, 4, noise=0.1, seed=0)
    model = fit_sae(data.x[:6400], "batchtopk", 64, 4, seed=0, device="cpu")
    held = data.x[6400:]
    oracle = oracle_fvu(replace(data, x=held, s=data.s[6400:]), 4)
    assert fvu(held, model.decode(model.encode(held))) < 2 * oracle


def test_a_step_budget_stops_mid_epoch_and_spans_the_schedule():
    """max_steps = 20 with 8 batches per epoch over 40 epochs: 20 steps (2.5 epochs), the lr schedule ends at its
    floor on the last step, and the history has the 3 epochs that ran."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 3)).astype(np.float32)
    weight = np.ones((256, 1), dtype=np.float32)

    def batches(epoch):
        for start in range(0, 256, 32):
            yield x[start:start + 32], weight[start:start + 32]

    module = Quadratic()
    result = fit(module, batches, 8, TrainSettings(epochs=40, min_steps=0, lr=0.1, min_lr_frac=0.0, max_steps=20), seed=0)
    assert module.steps == 20 and len(result.history) == 3 and result.best_epoch == 3
    assert result.history[-1]["lr"] == pytest.approx(0.0, abs=1e-12)


def test_bf16_is_ignored_on_the_cpu_and_by_modules_not_safe_in_it(caplog):
    from pipeline.models.registry import build
    from pipeline.training.loop import use_bf16

    settings = TrainSettings(precision="bf16")
    with caplog.at_level("INFO"):
        assert not use_bf16(Quadratic(), settings, torch.device("cpu"))
    assert "precision bf16 ignored (not on a GPU)" in caplog.text
    assert build("cedar", 4, 4, 2).autocast_safe is False and build("topk", 4, 8, 2).autocast_safe is True
    assert not use_bf16(build("cedar", 4, 4, 2), settings, torch.device("cuda")), "a rotation stays in float32 even on a GPU"
    assert not use_bf16(Quadratic(), TrainSettings(), torch.device("cuda"))
    with pytest.raises(ValueError, match="precision"):
        TrainSettings(precision="fp8")


def test_prefetched_batches_arrive_in_order_on_the_device():
    from pipeline.training.loop import prefetched

    read = []

    def source():
        for i in range(4):
            read.append(i)
            yield np.full((2, 3), i, dtype=np.float64)

    out = prefetched(source(), torch.device("cpu"))
    first = next(out)
    assert read == [0, 1], "the next batch is read (and sent) before the current one is used"
    rest = list(out)
    assert [int(b[0, 0]) for b in [first, *rest]] == [0, 1, 2, 3] and all(b.dtype == torch.float32 for b in rest)
