"""The report's tables (pipeline.report.tables): choosing each method's best run and putting the runs'
explanations side by side, from records shaped like the evaluate stage's."""

from __future__ import annotations

import pytest

from pipeline.explain.explanations import explain_run
from pipeline.models.options import DEVIATIONS, PUBLISHED
from pipeline.report.tables import (
    best_run,
    best_runs,
    best_score,
    confusion,
    conventions,
    example_table,
    explorer,
    family_separation,
    rates_table,
    report_images,
    separation,
)
from pipeline.scoring.options import EvaluateSettings


def metrics(run: str, method: str, objects: float | None, multi: float = 0.0, k: int = 8) -> dict:
    concepts = {"multi": {"trained": {"match_score": multi}}}
    if objects is not None:
        concepts = {"objects": {"trained": {"match_score": objects}}, **concepts}
    return {"run": run, "method": method, "k": k, "concepts": concepts}


def test_best_runs_use_the_objects_match_score_and_never_compare_across_k() -> None:
    runs = [metrics("cedar-8", "cedar", 0.4, multi=0.9), metrics("cedar-16", "cedar", 0.6, k=16), metrics("topk-64-8", "topk", 0.5),
            metrics("topk-128-8", "topk", float("nan")), metrics("topk-64-16", "topk", 0.2, k=16)]
    assert best_runs(runs) == {("cedar", 8): "cedar-8", ("cedar", 16): "cedar-16", ("topk", 8): "topk-64-8", ("topk", 16): "topk-64-16"}
    assert best_run(runs) == "cedar-16"
    assert best_score(metrics("x", "m", None, multi=0.3)) == 0.3  # no objects kind: the first kind
    assert best_score({"run": "x", "method": "m", "concepts": {}}) == float("-inf")
    assert best_runs([metrics("a", "m", 0.5), metrics("b", "m", 0.5)]) == {("m", 8): "a"}  # ties: the first
    with pytest.raises(ValueError, match="runs"):
        best_run([])


# --- the report's view ---------------------------------------------------------------------------------
def test_report_view_puts_the_best_runs_side_by_side(identity_run: dict) -> None:
    e = explain_run(identity_run["model"], 1, identity_run["decoder"], [identity_run["kind"]], identity_run["concepts"], identity_run["b"], identity_run["settings"])
    explains = {"identity-1": {"run": "identity-1", "method": "identity", **e}, "identity-2": {"run": "identity-2", "method": "identity", **e}}
    runs = [{**metrics("identity-1", "identity", 0.7, k=1), "size": 4}, {**metrics("identity-2", "identity", 0.2, k=1), "size": 4}]
    runs[0]["concepts"]["objects"]["trained"]["coalitions"] = [[0], [1, 5], [], []]  # red: latent +0; green: +1 and -1
    best = best_runs(runs)
    assert best == {("identity", 1): "identity-1"}
    examples = example_table(explains, best)
    assert [x["row"] for x in examples] == [40, 41] and examples[0]["dense_caption"] == "a red thing"
    assert examples[0]["runs"] == [{"method": "identity", "run": "identity-1", "k": 1, "concepts": [["red", 1.0]],
                                    "captions": {"sparse": "a red thing", "topk_original": "a red thing"},
                                    "describes": {"sparse": True, "topk_original": True}}]
    table = rates_table(list(explains.values()))
    assert [r["run"] for r in table["objects"]] == ["identity-1", "identity-2"]
    assert table["objects"][0]["relevance"]["dense_precision"] == 0.5 and table["objects"][0]["sparse"] == 1.0
    assert table["objects"][0]["attribute_precision"] == {"dense": 1.0, "sparse": 1.0, "topk_original": 1.0}
    assert report_images(list(explains.values())) == ([40, 41, 42, 43], [7])
    view = explorer(runs, explains, {"objects": ["red", "green", "blue", "yellow"]}, {"r40": 0, "r41": 1, "p7b": 5})
    assert view["tiles"] == {40: 0, 41: 1}
    assert [(r["run"], r["k"], r["size"], r["score"]) for r in view["runs"]] == [("identity-1", 1, 4, 0.7), ("identity-2", 1, 4, 0.2)]
    words = view["words"]
    first = view["runs"][0]["latents"][0]
    assert (first["id"], first["r"], [words[w] for w in first["n"]]) == ("+0", [40], ["red", "green"])
    assert [words[first["m"]["objects"][0]], first["m"]["objects"][1]] == ["red", 1.0]
    assert {k: [words[w] for w in v] for k, v in first["c"].items()} == {"objects": ["red"]}
    second = view["runs"][0]["latents"][1]
    assert {k: [words[w] for w in v] for k, v in second["c"].items()} == {"objects": ["green"]}
    assert view["runs"][1]["latents"][0]["c"] == {}  # identity-2 records no coalitions
    assert view["runs"][0]["pairs"][0]["before"] == 5 and view["runs"][0]["pairs"][0]["after"] == -1  # -1: no image
    assert set(view["runs"][0]["floor"]) == {"n", "mean", "p95", "max"}
    assert len(words) == len(set(words)), "every word once"


def test_confusion_rows_are_shares_of_each_true_value() -> None:
    (table,) = confusion({"shape": {"accuracy": 0.75, "confusion": [[3, 1], [0, 0]]}, "size": {"accuracy": 1.0}}, {"shape": ["circle", "square"]})
    assert table["names"] == ["circle", "square"] and table["rows"] == [[[0.75, 3], [0.25, 1]], [[0.0, 0], [0.0, 0]]]


def concept_record(run: str, method: str, trained: float, untrained: float, random: float) -> dict:
    variant = lambda v: {"match_score": v, "tapas": {"score": v}, "cknna": 0.5, "fms": None}  # noqa: E731
    return {"run": run, "method": method, "k": 4, "best_epoch": 3,
            "concepts": {"objects": {"trained": variant(trained), "untrained": variant(untrained), "random": variant(random)}}}


def test_separation_counts_runs_where_trained_beats_both_baselines() -> None:
    runs = [concept_record("a", "m", 0.6, 0.3, 0.2), concept_record("b", "m", 0.4, 0.5, 0.1), concept_record("c", "m", 0.7, 0.1, 0.69)]
    rows = {row["metric"]: row for row in separation(runs, "objects")}
    assert (rows["MATCHScore (FBMP)"]["above"], rows["MATCHScore (FBMP)"]["runs"]) == (2, 3)  # b: untrained is higher
    assert not rows["MATCHScore (FBMP)"]["separates"]  # 2/3 < 80%
    assert (rows["CKNNA"]["above"], rows["CKNNA"]["separates"]) == (0, False)  # ties are not above
    assert rows["FMS"]["runs"] == 0 and not rows["FMS"]["separates"]  # undefined everywhere: nothing counted
    assert separation(runs[:1], "objects")[0]["separates"]
    assert rows["MATCHScore (FBMP)"]["by_k"] == {4: (2, 3)}
    fixed = {**concept_record("d", "pca", 0.5, 0.5, 0.1), "best_epoch": 0}  # nothing trained: its twin is itself
    eight = {**concept_record("e", "m", 0.1, 0.5, 0.1), "k": 8}
    rows = {row["metric"]: row for row in separation([*runs, fixed, eight], "objects")}
    assert rows["MATCHScore (FBMP)"]["by_k"] == {4: (2, 3), 8: (0, 1)} and rows["MATCHScore (FBMP)"]["runs"] == 4


def family_record(run: str, scores: dict[str, tuple[float | None, float, float]]) -> dict:
    """A run whose TAPAScore per family is (trained, untrained, random)."""
    variants = {v: {"tapas": {"score": 0.0, "families": {f: {"score": s[i]} for f, s in scores.items()}}} for i, v in
                enumerate(("trained", "untrained", "random"))}
    return {"run": run, "method": "m", "k": 4, "best_epoch": 2, "concepts": {"objects": variants}}


def test_family_separation_by_hand_with_the_reason_for_each_family_that_does_not_separate() -> None:
    runs = [family_record("a", {"colour": (1.0, 0.2, 0.0), "shape": (0.1, 0.3, 0.0), "size": (0.5, 0.4, 0.6), "top": (None, 0.1, 0.0)}),
            family_record("b", {"colour": (0.8, 0.4, 0.1), "shape": (0.3, 0.1, 0.0), "size": (0.9, 0.4, 0.0), "top": (None, 0.0, 0.0)})]
    zero_shot = {"colour": {"accuracy": 1.0, "chance": 0.25}, "shape": {"accuracy": 0.3, "chance": 1 / 6}, "size": {"accuracy": 0.9, "chance": 1 / 3}}
    rows = {row["family"]: row for row in family_separation(runs, "objects", zero_shot)}
    assert list(rows) == ["colour", "shape", "size", "top"]
    colour = rows["colour"]
    assert (colour["above"], colour["runs"], colour["separates"], colour["why"]) == (2, 2, True, "")
    assert colour["trained"] == pytest.approx(0.9) and colour["untrained"] == pytest.approx(0.3) and colour["random"] == pytest.approx(0.05)
    assert (rows["shape"]["above"], rows["shape"]["separates"]) == (1, False)  # 1/2 < 80%
    assert rows["shape"]["why"].startswith("the encoder barely sees it (zero-shot accuracy 0.30, chance 0.17)")
    assert (rows["size"]["above"], rows["size"]["separates"]) == (1, False)  # run a: random codes score higher
    assert rows["size"]["why"] == ("the encoder sees it (zero-shot accuracy 0.90); trained codes follow its edits no better than both "
                                   "baselines (k=4: 1/2 runs)")
    assert rows["size"]["by_k"] == {4: (1, 2)}
    assert (rows["top"]["runs"], rows["top"]["trained"], rows["top"]["why"]) == (0, None, "no run matched a latent to its edited attributes")


def test_family_separation_names_the_k_where_a_seen_family_does_not_separate() -> None:
    low = [{**family_record(f"a{i}", {"size": (1.0, 0.2, 0.0)}), "k": 8} for i in range(3)]
    high = [{**family_record(f"b{i}", {"size": (0.5, 0.6, 0.0)}), "k": 32} for i in range(2)]
    (row,) = family_separation([*low, *high], "objects", {"size": {"accuracy": 0.9, "chance": 1 / 3}})
    assert (row["above"], row["runs"], row["separates"], row["by_k"]) == (3, 5, False, {8: (3, 3), 32: (0, 2)})
    assert row["why"] == ("the encoder sees it (zero-shot accuracy 0.90); trained codes follow its edits better than both baselines at "
                          "k=8: 3/3 runs but not at k=32: 0/2, where the untrained twin's matched latents follow them about as well")


def test_conventions_name_every_deviation_from_the_published_defaults() -> None:
    published = conventions(EvaluateSettings())
    assert [c["deviation"] for c in published] == [False] * 5
    assert published[0]["value"] == "1e-08" and published[1]["value"] == "is left out if its added coalition is empty"
    ours = {c["convention"]: c for c in conventions(EvaluateSettings(active_threshold=0.0, tapas_empty="zero", fms_removals=(1,),
                                                                    fms_levels="paper", fms_exhausted="majority"))}
    assert all(c["deviation"] for c in ours.values())
    assert ours["TAPAScore: a pair with an empty coalition"]["value"] == "counts as 0"
    assert ours["FMS: a removal count with no latent left to split"]["value"] == "scores the majority rate"
    assert ours["FMS: removals averaged"]["published"] == "1..9"
    # the methods' options: a default that departs from the published recipe (PUBLISHED) is named as a deviation
    rescale, slack, resample = (f"relu: {text}" for text in DEVIATIONS["relu"].values())
    with_methods = {c["convention"]: c for c in conventions(EvaluateSettings(), {"topk": {}, "relu": {"rescale": False, "l1_coef": 0.05}})[5:]}
    assert {name: (c["value"], c["published"], c["deviation"]) for name, c in with_methods.items()} == {
        rescale: ("off", "off", False),
        slack: ("on (0.05)", "off", True),  # the defaults: ReLU's controller aimed 5 % above k ...
        resample: ("on (0.05)", "off", True),  # ... and resampling, for every SAE
        f"topk: {DEVIATIONS['topk']['resample_every']}": ("on (0.05)", "off", True),
    }
    published_recipe = conventions(EvaluateSettings(), {"relu": {"rescale": False, **PUBLISHED["relu"]}, "matryoshka_prefix": PUBLISHED["matryoshka_prefix"]})[5:]
    assert not any(c["deviation"] for c in published_recipe), "the published values deviate from nothing"
    rescaled = next(c for c in conventions(EvaluateSettings(), {"relu": {"rescale": True}})[5:] if c["convention"] == rescale)
    assert (rescaled["value"], rescaled["published"], rescaled["deviation"]) == ("on", "off", True)
