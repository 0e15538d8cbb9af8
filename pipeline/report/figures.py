"""Plotly figures for the report, from the metrics the evaluate stages wrote (no recomputation)."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go


def fvu_vs_k(curves: list[dict[str, Any]]) -> go.Figure:
    """FVU against K (mean active latents): one line per rotation run, one line per SAE method and
    dictionary size across its k; untrained twins dashed."""
    fig = go.Figure()
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for point in curves:
        if point.get("rotation"):
            key = (point["run"], point["model"])
        else:
            key = (f"{point['method']}-{point['size']}", point["model"])
        groups.setdefault(key, []).append(point)
    for (name, model), points in sorted(groups.items()):
        points = sorted(points, key=lambda p: p["K"])
        fig.add_trace(go.Scatter(
            x=[p["K"] for p in points], y=[p["fvu"] for p in points], mode="lines+markers",
            name=f"{name} ({model})", line={"dash": "dash" if model != "trained" else "solid"},
            visible=True if model == "trained" else "legendonly",
            hovertemplate="%{fullData.name}<br>K=%{x:.2f}<br>FVU=%{y:.4f}<extra></extra>",
        ))
    fig.update_layout(xaxis_title="K (mean active latents, L0)", yaxis_title="FVU (test split)", xaxis_type="log",
                      yaxis_rangemode="tozero", template="plotly_white", height=460, margin={"t": 30})
    return fig


def zero_shot(accuracy: dict[str, dict[str, float]]) -> go.Figure:
    """Zero-shot accuracy per attribute family against chance."""
    families = list(accuracy)
    fig = go.Figure([
        go.Bar(x=families, y=[accuracy[f]["accuracy"] for f in families], name="zero-shot accuracy"),
        go.Bar(x=families, y=[accuracy[f]["chance"] for f in families], name="chance"),
    ])
    fig.update_layout(yaxis_title="accuracy (test split)", yaxis_range=[0, 1], barmode="group", template="plotly_white",
                      height=360, margin={"t": 30})
    return fig


VARIANT_COLOURS = {"trained": "#2458c6", "untrained": "#e8a33d", "random": "#9aa4b2"}
SANITY_METRICS = [
    ("match_score", "MATCHScore (FBMP)"),
    ("tapas", "TAPAScore"),
    ("cknna", "CKNNA"),
    ("fms", "FMS"),
]


def sanity_value(variant: dict[str, Any], key: str) -> float | None:
    """One headline number of a variant's concept metrics (None where it does not exist)."""
    if key == "tapas":
        return None if variant.get("tapas") is None else variant["tapas"]["score"]
    return variant.get(key)


def sanity_panel(runs: list[dict[str, Any]], kind: str) -> go.Figure:
    """Trained vs untrained vs random codes, per run, for each concept metric (SPEC.md B sanity check)."""
    from plotly.subplots import make_subplots

    names = [r["run"] for r in runs]
    fig = make_subplots(rows=len(SANITY_METRICS), cols=1, shared_xaxes=True, vertical_spacing=0.04,
                        subplot_titles=[title for _, title in SANITY_METRICS])
    for row, (key, _) in enumerate(SANITY_METRICS, start=1):
        for variant, colour in VARIANT_COLOURS.items():
            values = [sanity_value(r["concepts"][kind][variant], key) for r in runs]
            fig.add_trace(go.Bar(x=names, y=values, name=variant, marker_color=colour, legendgroup=variant, showlegend=row == 1,
                                 hovertemplate=f"%{{x}}<br>{variant}: %{{y:.3f}}<extra></extra>"), row=row, col=1)
    fig.update_layout(barmode="group", template="plotly_white", height=260 * len(SANITY_METRICS), margin={"t": 40})
    return fig


def scores_vs_size(runs: list[dict[str, Any]], kind: str) -> go.Figure:
    """MATCHScore and TAPAScore of trained SAEs against dictionary size, one line per (method, k)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=3, subplot_titles=["MATCHScore (FBMP)", "Delta-MATCHScore", "TAPAScore"])
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in runs:
        if not r["rotation"]:
            groups.setdefault((r["method"], r["k"]), []).append(r)
    palette = ["#2458c6", "#e8a33d", "#1a7f37", "#b42318", "#7b4bc4", "#0e8a8a", "#c4458a", "#6b7686"]
    for i, ((method, k), members) in enumerate(sorted(groups.items())):
        members = sorted(members, key=lambda r: r["size"])
        sizes = [r["size"] for r in members]
        series = [
            [r["concepts"][kind]["trained"]["match_score"] for r in members],
            [r["concepts"][kind]["delta_match_score"] for r in members],
            [sanity_value(r["concepts"][kind]["trained"], "tapas") for r in members],
        ]
        for col, ys in enumerate(series, start=1):
            fig.add_trace(go.Scatter(x=sizes, y=ys, mode="lines+markers", name=f"{method} k={k}", legendgroup=f"{method}-{k}",
                                     line={"color": palette[i % len(palette)], "dash": "solid" if i < len(palette) else "dot"},
                                     showlegend=col == 1, hovertemplate=f"{method} k={k}<br>size %{{x}}<br>%{{y:.3f}}<extra></extra>"),
                          row=1, col=col)
    fig.update_xaxes(type="log", title_text="dictionary size")
    fig.update_layout(template="plotly_white", height=420, margin={"t": 40})
    return fig


SOURCE_COLOURS = {"dense": "#9aa4b2", "sparse": "#2458c6", "topk_original": "#e8a33d"}
SOURCE_NAMES = {"dense": "dense embedding", "sparse": "sparse reconstruction (model, its k)", "topk_original": "top-k in the original basis (same k)"}


def explanation_rates(rows: list[dict[str, Any]], kind: str) -> go.Figure:
    """Per method (its best run), for each caption source: the "describes the image" rate and the fraction of
    stated attributes that are true; where the kind is scored, the relevance (precision / recall) of the
    model's named concepts against the dense reference. rows: `pipeline.explanations.rates_table(...)[kind]`
    entries (one per best run)."""
    from plotly.subplots import make_subplots

    scored = any(r["relevance"] for r in rows)
    titles = ['"describes the image" rate', "stated attributes that are true"] + (["relevance of named concepts (top-m)"] if scored else [])
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles)
    labels = [f"{r['method']} ({r['run']})" for r in rows]
    for source, colour in SOURCE_COLOURS.items():
        for col, values in ((1, [r[source] for r in rows]), (2, [(r.get("attribute_precision") or {}).get(source) for r in rows])):
            fig.add_trace(go.Bar(x=labels, y=values, name=SOURCE_NAMES[source], marker_color=colour, legendgroup=source, showlegend=col == 1,
                                 hovertemplate=f"%{{x}}<br>{source}: %{{y:.3f}}<extra></extra>"), row=1, col=col)
    if scored:
        series = [("model_precision", "model: precision", "#2458c6"), ("model_recall", "model: recall", "#7b9be0"),
                  ("dense_precision", "dense: precision", "#6b7686"), ("dense_recall", "dense: recall", "#b8c2d3")]
        for key, name, colour in series:
            fig.add_trace(go.Bar(x=labels, y=[(r["relevance"] or {}).get(key) for r in rows], name=name, marker_color=colour,
                                 hovertemplate=f"%{{x}}<br>{name}: %{{y:.3f}}<extra></extra>"), row=1, col=3)
    fig.update_yaxes(range=[0, 1])
    fig.update_layout(barmode="group", template="plotly_white", height=440, margin={"t": 40}, legend={"orientation": "h", "y": -0.25})
    return fig


def describes_vs_k(explains: list[dict[str, Any]], kind: str) -> go.Figure:
    """Caption quality against k for rotation runs (one trained rotation serves every k): the "describes the
    image" rate and the fraction of stated attributes that are true, for the model's sparse reconstruction
    (one line per run), top-k in the original basis (the same for every run; drawn once, dashed) and the
    dense embedding (dotted)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=['"describes the image" rate', "stated attributes that are true"])
    baseline: dict[int, dict[str, Any]] = {}
    dense: dict[str, Any] = {}
    palette = ["#2458c6", "#1a7f37", "#b42318", "#7b4bc4", "#0e8a8a", "#c4458a"]
    for i, e in enumerate(explains):
        points = sorted((p["k"], p) for p in e.get("describes_curve", []) if p["kind"] == kind and p["source"] == "sparse")
        if not points:
            continue
        for col, key in ((1, "rate"), (2, "attribute_precision")):
            fig.add_trace(go.Scatter(x=[k for k, _ in points], y=[p.get(key) for _, p in points], mode="lines+markers", name=f"{e['run']} (sparse)",
                                     line={"color": palette[i % len(palette)]}, legendgroup=e["run"], showlegend=col == 1,
                                     hovertemplate=f"{e['run']}<br>k=%{{x}}<br>%{{y:.3f}}<extra></extra>"), row=1, col=col)
        baseline.update({p["k"]: p for p in e["describes_curve"] if p["kind"] == kind and p["source"] == "topk_original"})
        rates = e["describes"].get(kind, {})
        dense = {"rate": rates.get("dense"), "attribute_precision": (rates.get("attribute_precision") or {}).get("dense")}
    ks = sorted(baseline)
    for col, key in ((1, "rate"), (2, "attribute_precision")):
        if ks:
            fig.add_trace(go.Scatter(x=ks, y=[baseline[k].get(key) for k in ks], mode="lines+markers", name="top-k in the original basis",
                                     line={"dash": "dash", "color": SOURCE_COLOURS["topk_original"]}, legendgroup="topk", showlegend=col == 1),
                          row=1, col=col)
            if dense.get(key) is not None:
                fig.add_trace(go.Scatter(x=[ks[0], ks[-1]], y=[dense[key]] * 2, mode="lines", name="dense embedding", legendgroup="dense",
                                         line={"dash": "dot", "color": "#6b7686"}, showlegend=col == 1), row=1, col=col)
    fig.update_xaxes(type="log", title_text="k (active coordinates)", tickvals=ks or None)
    fig.update_yaxes(range=[0, 1])
    fig.update_layout(template="plotly_white", height=380, margin={"t": 30})
    return fig
