"""The report's headline figures (pipeline.report.figures): what each draws, from records shaped like the stages'."""

from __future__ import annotations

from pipeline.report import figures


def curve(run: str, method: str, size: int, model: str, ks: list[int], rotation: bool) -> list[dict]:
    return [{"run": run, "method": method, "size": size, "model": model, "k": k, "K": float(k), "fvu": 1 / (k + 1),
             "rotation": rotation} for k in ks]


def test_fvu_vs_k_draws_fixed_bases_once_and_hides_the_twins_behind_one_legend_entry() -> None:
    points = (curve("cedar-8", "cedar", 16, "trained", [1, 2, 4, 8, 16], True) + curve("cedar-8", "cedar", 16, "untrained", [1, 2, 4, 8, 16], True)
              + curve("pca-8", "pca", 16, "trained", [1, 4, 16], True) + curve("pca-32", "pca", 16, "trained", [1, 4, 16], True)
              + [p for size in (64, 128) for m in ("topk", "relu") for k in (4, 8)
                 for p in curve(f"{m}-{size}-{k}", m, size, "trained", [k], False) + curve(f"{m}-{size}-{k}", m, size, "untrained", [k], False)])
    fig = figures.fvu_vs_k(points)
    names = [t.name for t in fig.data]
    assert names.count("pca") == 1, "a fixed basis is drawn once whatever the cells' k"
    assert "cedar (trained at k=8)" in names
    twins = [t for t in fig.data if t.legendgroup == "untrained"]
    assert twins and all(t.visible in ("legendonly", False) for t in twins)
    assert sum(bool(t.showlegend) for t in twins) == 1, "one legend entry for every untrained twin"
    sae = [t for t in fig.data if t.name in ("topk", "relu")]
    assert {t.meta for t in sae} == {64, 128} and sum(t.visible is True for t in sae) == 2  # one size shown at a time
    assert len(fig.layout.updatemenus[0].buttons) == 2
    assert list(fig.layout.xaxis.tickvals) == [1, 2, 4, 8, 16]


def test_sanity_summary_has_one_bar_per_method_and_variant() -> None:
    def variant(v: float) -> dict:
        return {"match_score": v, "tapas": {"score": v}, "cknna": v, "fms": v}

    runs = [{"run": f"{m}-{i}", "method": m, "size": 8, "k": 2, "rotation": False,
             "concepts": {"objects": {"trained": variant(0.5 + i), "untrained": variant(0.2), "random": variant(0.1)}}}
            for m in ("topk", "relu") for i in (0, 1)]
    fig = figures.sanity_summary(runs, "objects")
    trained = [t for t in fig.data if t.name == "trained"]
    assert len(trained) == 4 and list(trained[0].x) == ["topk", "relu"]
    assert list(trained[0].y) == [1.0, 1.0]  # mean of 0.5 and 1.5
    assert list(trained[0].error_y.array) == [0.5, 0.5] and list(trained[0].error_y.arrayminus) == [0.5, 0.5]


def test_zero_shot_confusion_normalises_rows() -> None:
    fig = figures.zero_shot_confusion({"shape": {"accuracy": 0.75, "confusion": [[3, 1], [1, 3]]}}, {"shape": ["circle", "square"]})
    (heatmap,) = fig.data
    assert heatmap.z.tolist() == [[0.75, 0.25], [0.25, 0.75]] and list(heatmap.x) == ["circle", "square"]
