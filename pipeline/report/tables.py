"""The report's tables, built from what the evaluate stages wrote (metrics.json, explain.json): no recomputation.

- choosing runs: `best_score` (a run's trained FBMP MATCHScore), `best_runs` (each method's best run at each k), `best_run`;
- the latent explorer's data of every run (`explorer`), the explanations side by side (`example_table`, `rates_table`),
  the images the page shows (`report_images`) and the encoder's zero-shot confusion (`confusion`);
- the sanity check in numbers (`separation`, per edited family `family_separation`) and the evaluation conventions
  in use (`conventions`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from pipeline.models.options import DEVIATIONS, PUBLISHED, options_class
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


def best_runs(runs: list[dict[str, Any]]) -> dict[tuple[str, int], str]:
    """(method, k) -> name of its best run at that k (highest `best_score` over its dictionary sizes; ties: the first
    in `runs` order), in order of first appearance. Runs at different k are never compared: a lower k is a harder
    task. runs: metrics.json contents (keys "run", "method", "k", "concepts")."""
    best: dict[tuple[str, int], tuple[float, str]] = {}
    for metrics in runs:
        score, key = best_score(metrics), (metrics["method"], int(metrics["k"]))
        if key not in best or score > best[key][0]:
            best[key] = (score, metrics["run"])
    return {key: name for key, (_, name) in best.items()}


def best_run(runs: list[dict[str, Any]]) -> str:
    """The name of the single best run over all methods (highest `best_score`; ties: first in order)."""
    if not runs:
        raise ValueError("runs: expected at least one evaluated run, got none")
    scores = [best_score(m) for m in runs]
    return runs[int(np.argmax(scores))]["run"]


# --- the report's view of every run's explanations ------------------------------------------------
def _round(value: Any, digits: int = 3) -> Any:
    """A float with `digits` significant digits (None for None or NaN): the explorer's JSON stays small."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(f"{value:.{digits}g}")


def explorer(runs: list[dict[str, Any]], explains: dict[str, dict[str, Any]], attributes: dict[str, list[str]],
             tiles: dict[str, int]) -> dict[str, Any]:
    """The latent explorer's data: every run (runs' order) with its kept latents and intervention pairs, in short keys,
    every concept and attribute name once in `words` (latents refer to them by position): the page stays small.

    Returns {"words": [...], "tiles": {dataset row: sprite tile}, "runs": [...]}. Per run: run, method, k, size, score
    (`best_score`), named, floor (explain.json's naming_floor: the best-concept cosine of random directions, or None),
    latents, pairs. Per latent: id (its label, e.g. "+3"), f (activation frequency), n / s (its names as word positions,
    and their cosines), r (dataset rows of its top images), v (its activations there), h / hm (histogram counts over
    [0, hm]), m (kind -> [word of its best-matching attribute, that test F1] or None), c (kind -> words of the attributes
    whose FBMP coalition holds it, from metrics.json). Per pair: kind, pair, edit, before / after (sprite tiles, -1 without
    an image), on / off ([label, name] of the latents that switched).
    runs: metrics.json contents; explains: run -> explain.json; attributes: kind -> its attribute names (the columns
    the coalitions index); tiles: thumbnail key ("r<row>", "p<i>b", "p<i>a") -> sprite tile."""
    words: dict[str, int] = {}

    def word(text: str) -> int:
        return words.setdefault(str(text), len(words))

    out = []
    for metrics in runs:
        name = metrics["run"]
        if name not in explains:
            raise ValueError(f"explains: no explanations for run {name!r}")
        e = explains[name]
        member: dict[int, dict[str, list[int]]] = {}
        for kind, concepts in metrics.get("concepts", {}).items():
            for column, coalition in enumerate((concepts.get("trained") or {}).get("coalitions") or []):
                for latent in coalition:
                    member.setdefault(int(latent), {}).setdefault(kind, []).append(word(attributes[kind][column]))
        latents = [{
            "id": latent["latent"], "f": _round(latent["frequency"]), "n": [word(n) for n in latent["names"]],
            "s": [_round(v) for v in latent["scores"]], "r": latent["top_images"], "v": [_round(v) for v in latent.get("top_values", [])],
            "h": (latent.get("histogram") or {}).get("counts", []), "hm": _round((latent.get("histogram") or {}).get("max")),
            "m": {kind: None if match is None else [word(match[0]), _round(match[1])] for kind, match in (latent.get("matches") or {}).items()},
            "c": member.get(int(latent["index"]), {}),
        } for latent in e["latents"]]
        pairs = [{"kind": p["kind"], "pair": p["pair"], "edit": p["edit"], "before": tiles.get(f"p{p['pair']}b", -1),
                  "after": tiles.get(f"p{p['pair']}a", -1), "on": [[s["latent"], s["name"]] for s in p["on"]],
                  "off": [[s["latent"], s["name"]] for s in p["off"]]} for p in e["pairs"]]
        floor = e.get("naming_floor")
        out.append({"run": name, "method": metrics["method"], "k": e["k"], "size": metrics.get("size"), "score": json_number(best_score(metrics)),
                    "named": e.get("named", True), "floor": None if floor is None else {key: _round(v) for key, v in floor.items()},
                    "latents": latents, "pairs": pairs})
    rows = {int(key[1:]): tile for key, tile in tiles.items() if key.startswith("r")}
    return {"words": list(words), "tiles": rows, "runs": out}


def example_table(explains: dict[str, dict[str, Any]], best: dict[tuple[str, int], str]) -> list[dict[str, Any]]:
    """The example images side by side across the methods' best runs at each k (best: `best_runs`).

    Every run explains the same example rows (seeded, see `explain_rows`); the dense caption and concepts
    do not depend on the run and are taken from the first. Returns per image: kind, row, truth,
    attributes, dense_concepts, dense_caption, dense_describes and runs (method, run, k, concepts,
    captions {sparse, topk_original}, describes {sparse, topk_original}), in the first run's order.
    """
    images: dict[tuple[str, int], dict[str, Any]] = {}
    for (method, _), name in best.items():
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


def report_images(explains: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """The dataset rows (every run's top-activating images and the example images) and the pair indices the report
    shows, sorted. explains: explain.json contents."""
    rows = {row for e in explains for latent in e["latents"] for row in latent["top_images"]} | {x["row"] for e in explains for x in e["examples"]}
    pairs = {p["pair"] for e in explains for p in e["pairs"]}
    return sorted(rows), sorted(pairs)


def confusion(zero_shot: dict[str, dict[str, Any]], values: dict[str, list[str]]) -> list[dict[str, Any]]:
    """The encoder's zero-shot confusion matrix of each family that has one, as table rows: family, accuracy, names
    (its values) and rows (per true value, [fraction of its images, count] per predicted value)."""
    out = []
    for family, record in zero_shot.items():
        if not record.get("confusion"):
            continue
        counts = np.asarray(record["confusion"], dtype=float)
        share = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
        names = values.get(family) or [str(j) for j in range(len(counts))]
        out.append({"family": family, "accuracy": json_number(record.get("accuracy")), "names": names,
                    "rows": [[[float(s), int(c)] for s, c in zip(srow, crow)] for srow, crow in zip(share, counts)]})
    return out


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
    options of the swept methods that change a published method (`pipeline.models.options.DEVIATIONS`; method_options:
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
        defaults = {f.name: f.default for f in dataclasses.fields(options_class(method))}
        published = {**defaults, **PUBLISHED.get(method, {})}
        value = {name: options.get(name, defaults[name]) for name in DEVIATIONS.get(method, {})}
        out += [{"convention": f"{method}: {text}", "value": _switch(value[name]), "published": _switch(published[name]),
                 "deviation": value[name] != published[name]} for name, text in DEVIATIONS.get(method, {}).items()]
    return out


def _switch(value: Any) -> str:
    """An option of `DEVIATIONS` for the conventions table: "off" when falsy, "on" for True, else "on (value)"."""
    if not value:
        return "off"
    return "on" if value is True else f"on ({value:g})"