"""The report's first screen: the method x k table of every kind, the sentences that say what it shows, and the sanity
check in words. Every sentence is computed from the numbers of the records (never fixed text), so it cannot contradict
the tables beside it."""

from __future__ import annotations

import math
from typing import Any

from pipeline.report.glossary import TERMS
from pipeline.report.tables import learned

#: (key, term) of the headline columns, in order
COLUMNS = (("match_score", "MATCHScore"), ("delta_match_score", "Delta-MATCHScore"), ("tapas", "TAPAScore"), ("fvu", "FVU"),
           ("cknna", "CKNNA"), ("fms", "FMS"))
#: what the published finding expects of each concept metric in the sanity check: separates trained codes from the
#: untrained twin and random codes (True) or not (False)
PUBLISHED_SEPARATES = {"MATCHScore (FBMP)": True, "TAPAScore": True, "CKNNA": False, "FMS": False}
#: relative FVU difference under which two methods reconstruct "about as well"
FVU_TIE = 0.05


def _number(value: Any) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _row(metrics: dict[str, Any], kind: str) -> dict[str, Any]:
    c = metrics["concepts"][kind]
    trained, untrained, random = c["trained"], c["untrained"], c["random"]
    tapas = lambda v: _number((v.get("tapas") or {}).get("score"))  # noqa: E731
    fixed = not learned(metrics)
    return {"method": metrics["method"], "k": int(metrics["k"]), "run": metrics["run"], "size": metrics["size"], "rotation": metrics["rotation"],
            "learned": not fixed, "match_score": _number(trained.get("match_score")), "untrained_match": _number(untrained.get("match_score")),
            "random_match": _number(random.get("match_score")),
            "delta_match_score": None if fixed else _number(c.get("delta_match_score")),
            "tapas": tapas(trained), "untrained_tapas": tapas(untrained), "fvu": _number(metrics["trained"]["fvu"]),
            "cknna": _number(trained.get("cknna")), "fms": _number(trained.get("fms"))}


def headline(runs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """One row per (method, k): the method's best run at that k on `kind` (highest MATCHScore over its dictionary
    sizes; ties: the first), ordered by k then by the methods' order in `runs`. Each row: method, k, run, size,
    rotation, learned, the COLUMNS' values (Delta-MATCHScore None for a fixed basis: 0 by construction), the untrained
    twin's and random codes' MATCHScore, and `best`: the COLUMNS keys on which it is the best of its k (ties all
    marked; direction from the glossary)."""
    chosen: dict[tuple[str, int], dict[str, Any]] = {}
    for metrics in runs:
        if kind not in metrics.get("concepts", {}):
            continue
        row = _row(metrics, kind)
        key = (row["method"], row["k"])
        score = row["match_score"] if row["match_score"] is not None else -math.inf
        if key not in chosen or score > (chosen[key]["match_score"] if chosen[key]["match_score"] is not None else -math.inf):
            chosen[key] = row
    order = list(dict.fromkeys(m["method"] for m in runs))
    rows = sorted(chosen.values(), key=lambda r: (r["k"], order.index(r["method"])))
    for row in rows:
        row["best"] = []
    for k in sorted({r["k"] for r in rows}):
        group = [r for r in rows if r["k"] == k]
        for key, term in COLUMNS:
            values = [r[key] for r in group if r[key] is not None]
            if not values:
                continue
            best = min(values) if TERMS[term].better == "lower" else max(values)
            for r in group:
                if r[key] is not None and r[key] == best:
                    r["best"].append(key)
    return rows


def _name(row: dict[str, Any]) -> str:
    return f"{row['method']} ({row['run']})"


def sentences(rows: list[dict[str, Any]]) -> list[str]:
    """Per k of `headline` rows: which method leads on MATCHScore and by how much over the next, whether it stands clear
    of its untrained twin, who leads on TAPAScore, and which methods reconstruct best (FVU, with those within 5%)."""
    out = []
    for k in sorted({r["k"] for r in rows}):
        group = [r for r in rows if r["k"] == k]
        ranked = sorted((r for r in group if r["match_score"] is not None), key=lambda r: -r["match_score"])
        if not ranked:
            out.append(f"At k = {k} no run has a MATCHScore.")
            continue
        lead = ranked[0]
        text = f"At k = {k}, {_name(lead)} has the highest MATCHScore, {lead['match_score']:.3f}"
        if len(ranked) > 1:
            text += f", {lead['match_score'] - ranked[1]['match_score']:.3f} above the next method, {ranked[1]['method']} ({ranked[1]['match_score']:.3f})"
        if not lead["learned"]:
            text += "; it is a fixed basis (nothing trained, so no untrained twin to beat)"
        elif lead["delta_match_score"] is not None and lead["delta_match_score"] > 0 and (lead["random_match"] is None or lead["match_score"] > lead["random_match"]):
            text += f", and it stands clear of its untrained twin (Delta-MATCHScore {lead['delta_match_score']:+.3f})"
        else:
            delta = "undefined" if lead["delta_match_score"] is None else f"{lead['delta_match_score']:+.3f}"
            text += f", but its untrained twin or random codes match as well (Delta-MATCHScore {delta}): the lead is not learned"
        text += "."
        tapas = sorted((r for r in group if r["tapas"] is not None), key=lambda r: (-r["tapas"], r is not lead))  # ties: the leader
        if tapas:
            text += (f" It also leads on TAPAScore ({tapas[0]['tapas']:.3f})." if tapas[0] is lead
                     else f" TAPAScore is highest for {_name(tapas[0])}, {tapas[0]['tapas']:.3f} (the MATCHScore leader: "
                          f"{'–' if lead['tapas'] is None else format(lead['tapas'], '.3f')}).")
        fvu = sorted((r for r in group if r["fvu"] is not None), key=lambda r: r["fvu"])
        if fvu:
            close = [r for r in fvu[1:] if r["fvu"] <= fvu[0]["fvu"] * (1 + FVU_TIE)]
            text += f" FVU is lowest for {fvu[0]['method']} ({fvu[0]['fvu']:.4f})"
            text += (f"; within {FVU_TIE:.0%} of it: " + ", ".join(f"{r['method']} ({r['fvu']:.4f})" for r in close) + "." if close else ".")
        out.append(text)
    return out


def _tally(by_k: dict[int, tuple[int, int]]) -> str:
    return ", ".join(f"k = {k}: {above}/{counted}" for k, (above, counted) in sorted(by_k.items()))


def sanity_sentences(separation: list[dict[str, Any]]) -> list[str]:
    """The sanity check in words, from `tables.separation` rows: per metric, in how many learned runs trained codes
    beat both baselines (per k) and at which k it separates (80% of the runs); then how that compares with the
    published finding (MATCHScore and TAPAScore separate, CKNNA and FMS do not)."""
    out, agree, surprise = [], [], []
    for row in separation:
        metric, by_k = row["metric"], row["by_k"]
        if not row["runs"]:
            out.append(f"{metric}: undefined in every learned run, so it cannot be checked.")
            continue
        passing = [k for k, (above, counted) in sorted(by_k.items()) if counted and above >= 0.8 * counted]
        if row["separates"] and len(passing) == len(by_k):
            verdict = "separates at every k"
        elif passing:
            verdict = f"separates at k = {', '.join(map(str, passing))} only" if not row["separates"] else \
                f"separates overall, but not at k = {', '.join(str(k) for k in sorted(by_k) if k not in passing)}"
        else:
            verdict = "does not separate at any k"
        out.append(f"{metric}: trained codes beat both baselines in {row['above']}/{row['runs']} learned runs ({_tally(by_k)}): {verdict}.")
        expected = PUBLISHED_SEPARATES.get(metric)
        if expected is not None:
            (agree if expected == row["separates"] else surprise).append((metric, expected))
    if agree:
        out.append("As in the published finding: " + "; ".join(f"{m} {'separates' if e else 'does not separate'}" for m, e in agree) + ".")
    if surprise:
        out.append("Unlike the published finding: " + "; ".join(f"{m} {'does not separate' if e else 'separates'} here" for m, e in surprise)
                   + ". Metrics that separate here measure something the training adds on this data; those that do not measure "
                     "something untrained codes have too (the per-k counts say at which sparsity the twins catch up).")
    return out


def delta_sentences(runs: list[dict[str, Any]], kind: str, strongest_k: int | None) -> list[str]:
    """Why learned runs score below their untrained twins on MATCHScore (a negative Delta-MATCHScore), from the
    diagnostic beside it (`evaluate.match_strongest`): when the same codes cut to each row's `strongest_k` largest
    activations put the trained model ahead, its strong activations match the concepts and the weak ones, which
    binarising counts like strong ones, cost it precision: the metric at that k, not the training. Otherwise the
    training or the model is the suspect. Empty when no learned run is below its twin."""
    below = [r for r in runs if r.get("best_epoch") and _number(r["concepts"][kind].get("delta_match_score")) is not None
             and r["concepts"][kind]["delta_match_score"] < 0]
    if not below:
        return []

    def names(rows: list[dict[str, Any]]) -> str:
        return ", ".join(f"{r['run']} ({r['concepts'][kind]['delta_match_score']:+.3f})" for r in rows)

    if strongest_k is None:
        return [f"Delta-MATCHScore is negative in {names(below)}; evaluate.match_strongest is off, so the report cannot say whether "
                "binarisation or the training is the cause."]
    strong = [r for r in below if (_number(r["concepts"][kind].get("delta_match_strongest")) or 0) > 0]
    weak = [r for r in below if r not in strong]
    out = []
    if strong:
        gains = ", ".join(f"{r['concepts'][kind]['delta_match_strongest']:+.3f}" for r in strong)
        out.append(f"Delta-MATCHScore is negative in {names(strong)}, but on each row's {strongest_k} strongest activations the same "
                   f"codes beat their untrained twin ({gains}): the trained latents also fire weakly on rows without their concept, "
                   "and binarising counts those weak activations like strong ones (the metric at this k, not the training; "
                   "docs/science.md, \"Delta-MATCHScore at large k\").")
    if weak:
        out.append(f"Delta-MATCHScore is negative in {names(weak)}, and stays so on each row's {strongest_k} strongest activations: "
                   "binarisation does not explain it; the training or the model does.")
    return out
