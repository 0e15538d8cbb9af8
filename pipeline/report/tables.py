"""The report's tables, built from what the evaluate stages wrote (metrics.json, explain.json): no recomputation.

- choosing runs: `best_score` (a run's trained FBMP MATCHScore), `best_runs` (each method's best run), `best_run`;
- the explanations side by side: `latent_browser`, `example_table`, `rates_table`, `report_images`;
- the sanity check in numbers (`separation`, per edited family `family_separation`) and the evaluation conventions
  in use (`conventions`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from pipeline.models import model_class
from pipeline.records import json_number

#: the caption sources, in the order the report shows them
SOURCES = ("dense", "sparse", "topk_original")


# --- choosing runs -----------------------------------------------------------------------------
def best_score(metrics: dict[str, Any]) -> float:
    """The score that picks a method's best run: trained FBMP MATCHScore (beta 0.5, k 3) on `objects`
    scenes, or on the first kind when the dataset has no objects; -inf when missing."""
    concepts = metrics.get("concepts") or {}
    kind = "objects" if "objects" in concepts else next(iter(concepts), None)
    value = None if kind is None else (concepts[kind].get("trained") or {}).get("match_score")
    return float("-inf") if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def best_runs(runs: list[dict[str, Any]]) -> dict[str, str]:
    """method -> name of its best run (highest `best_score`; ties: the first in `runs` order), methods in
    order of first appearance. runs: metrics.json contents (keys "run", "method", "concepts")."""
    best: dict[str, tuple[float, str]] = {}
    for metrics in runs:
        score = best_score(metrics)
        method = metrics["method"]
        if method not in best or score > best[method][0]:
            best[method] = (score, metrics["run"])
    return {method: name for method, (_, name) in best.items()}


def best_run(runs: list[dict[str, Any]]) -> str:
    """The name of the single best run over all methods (highest `best_score`; ties: first in order)."""
    if not runs:
        raise ValueError("runs: expected at least one evaluated run, got none")
    scores = [best_score(m) for m in runs]
    return runs[int(np.argmax(scores))]["run"]


# --- the report's view of every run's explanations ------------------------------------------------
def latent_browser(runs: list[dict[str, Any]], explains: dict[str, dict[str, Any]], best: dict[str, str]) -> list[dict[str, Any]]:
    """One entry per method, for its best run: run, method, k, score (`best_score`), named, latents (the
    explain.json list) and pairs (with the latents that switched). runs: metrics.json contents; explains:
    run name -> explain.json content; best: method -> run name (`best_runs`)."""
    metrics = {m["run"]: m for m in runs}
    out = []
    for method, name in best.items():
        if name not in explains:
            raise ValueError(f"explains: no explanations for run {name!r} (the best run of {method})")
        e = explains[name]
        out.append({"method": method, "run": name, "k": e["k"], "score": json_number(best_score(metrics[name])) if name in metrics else None,
                    "named": e.get("named", True), "latents": e["latents"], "pairs": e["pairs"]})
    return out


def example_table(explains: dict[str, dict[str, Any]], best: dict[str, str]) -> list[dict[str, Any]]:
    """The example images side by side across the methods' best runs.

    Every run explains the same example rows (seeded, see `explain_rows`); the dense caption and concepts
    do not depend on the run and are taken from the first. Returns per image: kind, row, truth,
    attributes, dense_concepts, dense_caption, dense_describes and runs (method, run, k, concepts,
    captions {sparse, topk_original}, describes {sparse, topk_original}), in the first run's order.
    """
    images: dict[tuple[str, int], dict[str, Any]] = {}
    for method, name in best.items():
        e = explains[name]
        for example in e["examples"]:
            key = (example["kind"], example["row"])
            if key not in images:
                images[key] = {"kind": example["kind"], "row": example["row"], "truth": example["truth"], "attributes": example["attributes"],
                               "dense_concepts": example["dense_concepts"], "dense_caption": example["captions"]["dense"],
                               "dense_describes": example["describes"]["dense"], "runs": []}
            images[key]["runs"].append({"method": method, "run": name, "k": e["k"], "concepts": example["concepts"],
                                        "captions": {s: example["captions"][s] for s in SOURCES[1:]},
                                        "describes": {s: example["describes"][s] for s in SOURCES[1:]}})
    return list(images.values())


def rates_table(explains: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """kind -> one row per run: run, method, k, relevance (model / dense precision and recall, or None when
    the kind is not scored), the "describes the image" rate of each source and (attribute_precision) the
    fraction of stated attributes that are true, per source."""
    table: dict[str, list[dict[str, Any]]] = {}
    for e in explains:
        for kind, rates in e["describes"].items():
            rel = e["relevance"].get(kind)
            table.setdefault(kind, []).append({
                "run": e["run"], "method": e["method"], "k": e["k"], "n_images": rates["n_images"],
                "relevance": None if rel is None else {"m": rel["m"], **{f"{source}_{metric}": rel[source][metric]
                                                                         for source in ("model", "dense") for metric in ("precision", "recall")}},
                **{source: rates[source] for source in SOURCES},
                "attribute_precision": dict(rates.get("attribute_precision") or {}),
            })
    return table


def report_images(browser: list[dict[str, Any]], examples: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """The dataset rows (top-activating and example images) and pair indices the report shows, sorted."""
    rows = {row for b in browser for latent in b["latents"] for row in latent["top_images"]} | {e["row"] for e in examples}
    pairs = {p["pair"] for b in browser for p in b["pairs"]}
    return sorted(rows), sorted(pairs)


# --- the sanity check and the conventions ----------------------------------------------------------------
#: (key, title) of the concept metrics the sanity check compares; TAPAScore and FBMP matching are the ones the
#: published finding expects to separate trained from untrained and random codes
SEPARATION_METRICS = (("match_score", "MATCHScore (FBMP)"), ("tapas", "TAPAScore"), ("cknna", "CKNNA"), ("fms", "FMS"))


def _variant_value(variant: dict[str, Any], key: str) -> float | None:
    value = (variant.get("tapas") or {}).get("score") if key == "tapas" else variant.get(key)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def learned(metrics: dict[str, Any]) -> bool:
    """Whether a run trained anything: a fixed basis (identity, PCA, ICA, a random rotation) records best_epoch 0, and
    its untrained twin is itself, so the trained-against-untrained check does not apply to it."""
    return bool(metrics.get("best_epoch"))


VARIANTS = ("trained", "untrained", "random")


def _tally_by_k(runs: list[dict[str, Any]], scores: Any) -> tuple[dict[int, tuple[int, int]], list[list[float]]]:
    """Over the learned runs whose `scores(metrics)` (trained, untrained, random) are all defined numbers: per k
    (runs where trained is above both, runs counted), ascending k, and those scores."""
    by_k: dict[int, list[int]] = {}
    values = []
    for metrics in filter(learned, runs):
        row = scores(metrics)
        if not all(isinstance(x, (int, float)) and not math.isnan(x) for x in row):
            continue
        values.append(row)
        tally = by_k.setdefault(int(metrics["k"]), [0, 0])
        tally[0] += row[0] > max(row[1], row[2])
        tally[1] += 1
    return {k: (by_k[k][0], by_k[k][1]) for k in sorted(by_k)}, values


def separation(runs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """Per concept metric, in how many learned runs (`learned`) the trained codes score above both the untrained twin
    and random codes on `kind` (runs where a value is undefined are not counted), overall and per k (`by_k`: k ->
    (above, counted)). `separates`: in at least 80% of the counted runs."""
    out = []
    for key, title in SEPARATION_METRICS:
        by_k, _ = _tally_by_k(runs, lambda m: [_variant_value(m["concepts"][kind][v], key) for v in VARIANTS])
        above, counted = sum(t[0] for t in by_k.values()), sum(t[1] for t in by_k.values())
        out.append({"metric": title, "runs": counted, "above": above, "separates": bool(counted) and above >= 0.8 * counted,
                    "by_k": by_k})
    return out


#: zero-shot accuracy below which the report says the encoder barely sees a family
SEEN_ACCURACY = 0.7


def _tally(by_k: dict[int, tuple[int, int]]) -> str:
    return ", ".join(f"k={k}: {above}/{counted}" for k, (above, counted) in sorted(by_k.items()))


def family_separation(runs: list[dict[str, Any]], kind: str, zero_shot: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per family the intervention pairs of `kind` edit: in how many learned runs the trained codes' TAPAScore on that
    family's pairs is above both the untrained twin's and random codes' (runs where a value is undefined are not
    counted), overall and per k (`by_k`), the mean of each over the counted runs, the encoder's zero-shot accuracy on
    the family when known, and, for a family that does not separate (`separates` as in `separation`), the likeliest
    reason in words."""
    families = sorted({f for m in runs for f in ((m["concepts"][kind]["trained"].get("tapas") or {}).get("families") or {})})
    out = []
    for family in families:
        by_k, values = _tally_by_k(runs, lambda m: [((m["concepts"][kind][v].get("tapas") or {}).get("families") or {})
                                                    .get(family, {}).get("score") for v in VARIANTS])
        counted, above = len(values), sum(t[0] for t in by_k.values())
        means = [json_number(m) for m in np.mean(values, axis=0)] if values else [None] * 3
        seen = zero_shot.get(family, {})
        accuracy, chance = (None if seen.get(key) is None else json_number(seen[key]) for key in ("accuracy", "chance"))
        separates = bool(counted) and above >= 0.8 * counted
        failing = {k: t for k, t in by_k.items() if t[0] < 0.8 * t[1]}
        passing = {k: t for k, t in by_k.items() if k not in failing}
        if separates:
            why = ""
        elif not counted:
            why = "no run matched a latent to its edited attributes"
        elif accuracy is not None and accuracy < SEEN_ACCURACY:
            why = (f"the encoder barely sees it (zero-shot accuracy {accuracy:.2f}, chance {chance:.2f}): no sparse code of "
                   "the embedding can follow an edit the embedding does not show")
        else:
            seen_text = f"the encoder sees it (zero-shot accuracy {accuracy:.2f}); " if accuracy is not None else ""
            why = seen_text + (f"trained codes follow its edits better than both baselines at {_tally(passing)} runs but not at "
                               f"{_tally(failing)}, where the untrained twin's matched latents follow them about as well"
                               if passing else f"trained codes follow its edits no better than both baselines ({_tally(failing)} runs)")
        out.append({"family": family, "runs": counted, "above": above, "by_k": by_k, "trained": means[0], "untrained": means[1],
                    "random": means[2], "zero_shot": accuracy, "separates": separates, "why": why})
    return out


def conventions(evaluate: Any, method_options: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The evaluation conventions in use against the published ones (the defaults of `EvaluateSettings`), then the
    options of the swept methods that change a published method (the model class's `DEVIATIONS`; method_options:
    method -> its validated options, `Params.method_options`): what the report's numbers mean, and where this run
    deliberately deviates."""
    rules = [
        ("active_threshold", "binarisation: a latent is active above", lambda v: f"{v:g}"),
        ("tapas_empty", "TAPAScore: a pair with an empty coalition", lambda v: {"drop_pair": "is left out if its added coalition is empty", "zero": "counts as 0", "skip": "leaves that mean"}[v]),
        ("fms_exhausted", "FMS: a removal count with no latent left to split", lambda v: {"drop": "leaves the mean", "majority": "scores the majority rate"}[v]),
        ("fms_removals", "FMS: removals averaged", lambda v: ", ".join(map(str, v)) if len(v) < 4 else f"{v[0]}..{v[-1]}"),
        ("fms_levels", "FMS: global term over", lambda v: {"published": "all levels but the root split, with the no-split level",
                                                           "paper": "levels 2..D (the paper's formula)"}[v]),
    ]
    defaults = {f.name: f.default for f in dataclasses.fields(type(evaluate))}
    out = [{"convention": text, "value": show(getattr(evaluate, name)), "published": show(defaults[name]),
            "deviation": getattr(evaluate, name) != defaults[name]} for name, text, show in rules]
    for method, options in (method_options or {}).items():
        cls = model_class(method)
        published = {f.name: f.default for f in dataclasses.fields(cls.Options)}
        out += [{"convention": text, "value": "on" if options[name] else "off", "published": "on" if published[name] else "off",
                 "deviation": options[name] != published[name]} for name, text in cls.DEVIATIONS.items()]
    return out