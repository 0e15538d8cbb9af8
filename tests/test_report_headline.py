"""The report's headline (pipeline.report.headline): the method x k table, its best marks, and the sentences computed from
the numbers: by hand, including the cases the sentences once got wrong (a fixed basis's Delta-MATCHScore, a sanity
text that contradicted the counts)."""

from __future__ import annotations

import pytest

from pipeline.report.headline import headline, sanity_sentences, sentences
from pipeline.report.tables import separation


def record(run: str, method: str, size: int, k: int, match: float, untrained: float, fvu: float, learned: bool = True,
           tapas: float = 0.5, random: float = 0.1) -> dict:
    def variant(m: float, t: float) -> dict:
        return {"match_score": m, "tapas": {"score": t}, "cknna": 0.2, "fms": 0.3}

    return {"run": run, "method": method, "size": size, "k": k, "rotation": size == 16, "best_epoch": 4 if learned else 0,
            "trained": {"fvu": fvu}, "concepts": {"objects": {"trained": variant(match, tapas), "untrained": variant(untrained, 0.1),
                                                              "random": variant(random, 0.0), "delta_match_score": match - untrained}}}


RUNS = [record("cedar-8", "cedar", 16, 8, 0.757, 0.5, 0.30), record("pca-8", "pca", 16, 8, 0.6, 0.6, 0.20, learned=False),
        record("topk-256-8", "topk", 256, 8, 0.70, 0.5, 0.25, tapas=0.9), record("topk-512-8", "topk", 512, 8, 0.793, 0.5, 0.24),
        record("cedar-32", "cedar", 16, 32, 0.60, 0.55, 0.0091), record("pca-32", "pca", 16, 32, 0.62, 0.62, 0.0090, learned=False),
        record("topk-256-32", "topk", 256, 32, 0.50, 0.52, 0.02)]


def test_headline_keeps_each_methods_best_size_per_k_and_marks_the_best_by_direction() -> None:
    rows = headline(RUNS, "objects")
    assert [(r["k"], r["method"], r["run"]) for r in rows] == [(8, "cedar", "cedar-8"), (8, "pca", "pca-8"), (8, "topk", "topk-512-8"),
                                                              (32, "cedar", "cedar-32"), (32, "pca", "pca-32"), (32, "topk", "topk-256-32")]
    by_run = {r["run"]: r for r in rows}
    assert "match_score" in by_run["topk-512-8"]["best"] and "fvu" in by_run["pca-8"]["best"]  # FVU: lower is better
    assert "fvu" not in by_run["topk-512-8"]["best"]
    assert by_run["pca-8"]["delta_match_score"] is None, "a fixed basis has no Delta-MATCHScore to judge: 0 by construction"
    assert by_run["cedar-8"]["delta_match_score"] == pytest.approx(0.257) and "delta_match_score" in by_run["topk-512-8"]["best"]
    assert set(by_run["cedar-32"]["best"]) >= {"delta_match_score"} and "match_score" in by_run["pca-32"]["best"]
    assert {"cknna", "fms"} <= set(by_run["cedar-8"]["best"]) and {"cknna", "fms"} <= set(by_run["topk-512-8"]["best"])  # ties: all marked


def test_sentences_say_who_leads_by_how_much_and_whether_it_beats_its_twin() -> None:
    at8, at32 = sentences(headline(RUNS, "objects"))
    assert at8.startswith("At k = 8, topk (topk-512-8) has the highest MATCHScore, 0.793, 0.036 above the next method, cedar (0.757), "
                          "and it stands clear of its untrained twin (Delta-MATCHScore +0.293).")
    assert "It also leads on TAPAScore (0.500)." in at8  # a tie goes to the MATCHScore leader
    assert "FVU is lowest for pca (0.2000)." in at8
    assert at32.startswith("At k = 32, pca (pca-32) has the highest MATCHScore, 0.620, 0.020 above the next method, cedar (0.600); "
                           "it is a fixed basis (nothing trained, so no untrained twin to beat).")
    assert "FVU is lowest for pca (0.0090); within 5% of it: cedar (0.0091)." in at32
    twin_wins = sentences(headline([record("topk-256-32", "topk", 256, 32, 0.50, 0.52, 0.02)], "objects"))[0]
    assert "but its untrained twin or random codes match as well (Delta-MATCHScore -0.020): the lead is not learned" in twin_wins


def test_sanity_sentences_follow_the_counts_not_the_published_expectation() -> None:
    def run(name: str, k: int, match: tuple[float, float, float], cknna: tuple[float, float, float]) -> dict:
        variant = lambda i: {"match_score": match[i], "tapas": {"score": match[i]}, "cknna": cknna[i], "fms": None}  # noqa: E731
        return {"run": name, "method": "topk", "k": k, "best_epoch": 3,
                "concepts": {"objects": {v: variant(i) for i, v in enumerate(("trained", "untrained", "random"))}}}

    runs = [run(f"a{i}", 8, (0.8, 0.5, 0.1), (0.5, 0.2, 0.1)) for i in range(3)] + [run(f"b{i}", 32, (0.5, 0.6, 0.1), (0.5, 0.2, 0.1)) for i in range(3)]
    text = sanity_sentences(separation(runs, "objects"))
    assert text[0] == ("MATCHScore (FBMP): trained codes beat both baselines in 3/6 learned runs (k = 8: 3/3, k = 32: 0/3): "
                       "separates at k = 8 only.")
    assert text[2] == "CKNNA: trained codes beat both baselines in 6/6 learned runs (k = 8: 3/3, k = 32: 3/3): separates at every k."
    assert text[3] == "FMS: undefined in every learned run, so it cannot be checked."
    assert len(text) == 5 and text[4].startswith("Unlike the published finding: MATCHScore (FBMP) does not separate here; TAPAScore does not "
                                                 "separate here; CKNNA separates here.")
    assert not any("As in the published finding" in t for t in text)


def test_delta_sentences_name_binarisation_only_where_the_strongest_activations_say_so() -> None:
    from pipeline.report.headline import delta_sentences

    def with_strongest(r: dict, delta: float | None) -> dict:
        return {**r, "concepts": {"objects": {**r["concepts"]["objects"], "delta_match_strongest": delta}}}

    runs = [with_strongest(RUNS[6], 0.21),  # topk-256-32: -0.02 at full k, +0.21 on the strongest 8
            with_strongest(record("relu-256-32", "relu", 256, 32, 0.40, 0.45, 0.03), -0.01),
            with_strongest(RUNS[0], 0.3),  # positive Delta: not mentioned
            with_strongest(RUNS[5], None)]  # a fixed basis: never "below its twin"
    binarised, unexplained = delta_sentences(runs, "objects", 8)
    assert binarised.startswith("Delta-MATCHScore is negative in topk-256-32 (-0.020), but on each row's 8 strongest")
    assert "(+0.210)" in binarised and "not the training" in binarised
    assert unexplained.startswith("Delta-MATCHScore is negative in relu-256-32 (-0.050), and stays so") and "the training" in unexplained
    assert delta_sentences(runs[2:], "objects", 8) == []
    (off,) = delta_sentences(runs, "objects", None)
    assert "match_strongest is off" in off
