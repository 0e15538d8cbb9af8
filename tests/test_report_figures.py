"""The report's headline figures (pipeline.report.figures): what each draws, from records shaped like the stages'."""

from __future__ import annotations

from pipeline.report import figures


def curve(run: str, method: str, size: int, model: str, ks: list[int], rotation: bool) -> list[dict]:
    return [{"run": run, "method": method, "size": size, "model": model, "k": k, "K": float(k), "fvu": 1 / (k + 1),
             "rotation": rotation} for k in ks]


def test_fvu_vs_k_draws_fixed_bases_once_one_panel_per_size_and_twins_behind_one_legend_entry() -> None:
    points = (curve("cedar-8", "cedar", 16, "trained", [1, 2, 4, 8, 16], True) + curve("cedar-8", "cedar", 16, "untrained", [1, 2, 4, 8, 16], True)
              + curve("pca-8", "pca", 16, "trained", [1, 4, 16], True) + curve("pca-32", "pca", 16, "trained", [1, 4, 16], True)
              + [p for size in (64, 128) for m in ("topk", "relu") for k in (4, 8)
                 for p in curve(f"{m}-{size}-{k}", m, size, "trained", [k], False) + curve(f"{m}-{size}-{k}", m, size, "untrained", [k], False)])
    fig = figures.fvu_vs_k(points)
    names = [t.name for t in fig.data]
    assert names.count("pca") == 1, "a fixed basis is drawn once whatever the cells' k"
    assert "cedar (trained at k=8)" in names
    twins = [t for t in fig.data if t.legendgroup == "untrained"]
    assert twins and all(t.visible == "legendonly" for t in twins)
    assert sum(bool(t.showlegend) for t in twins) == 1, "one legend entry for every untrained twin"
    assert not fig.layout.updatemenus, "panels, not buttons: no button re-hides what the reader turned on"
    sae = [t for t in fig.data if t.name in ("topk", "relu")]
    assert {(t.meta, t.xaxis) for t in sae} == {(64, "x2"), (128, "x3")} and all(t.visible is True for t in sae)
    assert [a.text for a in fig.layout.annotations] == ["rotations (d latents)", "SAEs, 64 latents", "SAEs, 128 latents"]
    cedar = [t for t in fig.data if t.name == "cedar (trained at k=8)"]
    assert [t.xaxis for t in cedar] == ["x", "x2", "x3"], "CEDAR is the reference in every SAE panel"
    assert list(fig.layout.xaxis.tickvals) == [1, 2, 4, 8, 16]


def concept_run(run: str, method: str, size: int, k: int, score: float, rotation: bool) -> dict:
    v = {"match_score": score, "tapas": {"score": score / 2}}
    return {"run": run, "method": method, "size": size, "k": k, "rotation": rotation, "best_epoch": 0 if method == "pca" else 5,
            "concepts": {"objects": {"trained": v, "delta_match_score": score / 4}}}


def test_scores_vs_size_keeps_every_method_in_the_legend_and_draws_rotations_as_references() -> None:
    runs = [concept_run("cedar-8", "cedar", 16, 8, 0.7, True), concept_run("cedar-32", "cedar", 16, 32, 0.6, True),
            concept_run("pca-8", "pca", 16, 8, 0.5, True), concept_run("pca-32", "pca", 16, 32, 0.55, True),
            *[concept_run(f"topk-{s}-{k}", "topk", s, k, 0.4 + s / 1000, False) for s in (64, 128) for k in (8, 32)],
            concept_run("relu-64-8", "relu", 64, 8, 0.3, False)]  # relu has no k = 32 run
    fig = figures.scores_vs_size(runs, "objects")
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == ["k = 8", "k = 32"]
    for button, k in zip(buttons, (8, 32)):
        visible = [t for t, v in zip(fig.data, button.args[0]["visible"]) if v]
        assert {t.meta for t in visible} == {k}
        in_legend = {t.name for t in visible if t.showlegend}
        assert in_legend == {r["method"] for r in runs if r["k"] == k}, "every method present at this k keeps its legend entry"
    cedar = [t for t in fig.data if t.name == "cedar" and t.xaxis == "x"]
    assert [(list(t.x), list(t.y), t.meta) for t in cedar] == [([64, 128], [0.7, 0.7], 8), ([64, 128], [0.6, 0.6], 32)]
    assert cedar[0].line.dash == "dash" and cedar[0].mode == "lines", "a rotation is a horizontal reference, not a diamond at d"
    assert {t.name for t in fig.data if t.xaxis == "x2"} == {"cedar", "topk", "relu"}, "a fixed basis has no Delta-MATCHScore to draw"


def test_scores_vs_k_one_line_per_method() -> None:
    rows = [{"method": m, "k": k, "run": f"{m}-{k}", "rotation": m == "cedar", "match_score": 0.1 * k, "tapas": 0.01 * k}
            for m in ("cedar", "topk") for k in (8, 32)]
    fig = figures.scores_vs_k(rows)
    assert [(t.name, list(t.x), list(t.y)) for t in fig.data[:2]] == [("cedar", [8, 32], [0.8, 3.2]), ("topk", [8, 32], [0.8, 3.2])]
    assert [t.showlegend for t in fig.data] == [True, True, False, False]


def test_method_colours_are_distinct() -> None:
    colours = [c.lower() for c in figures.METHOD_COLOURS.values()]
    assert len(set(colours)) == len(colours)
    assert not set(colours) & {c.lower() for c in figures.FALLBACK_COLOURS}


def test_explanation_rates_group_runs_by_k_never_across() -> None:
    rows = [{"run": f"{m}-{k}", "method": m, "k": k, "dense": 0.8, "sparse": 0.5, "topk_original": 0.3, "attribute_precision": {}, "relevance": None}
            for k in (32, 8) for m in ("cedar", "topk")]
    fig = figures.explanation_rates(rows, "objects")
    x = fig.data[0].x
    assert [list(level) for level in x] == [["k = 8", "k = 8", "k = 32", "k = 32"], ["cedar", "topk", "cedar", "topk"]]


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
