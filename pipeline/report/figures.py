"""Plotly figures for the report, from the metrics the evaluate stages wrote (no recomputation)."""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go

#: one colour per method, the same in every figure
METHOD_COLOURS = {
    "cedar": "#2458c6", "identity": "#6b7686", "pca": "#e8a33d", "ica": "#1a7f37", "random_rotation": "#b42318",
    "relu": "#7b4bc4", "topk": "#0e8a8a", "batchtopk": "#c4458a", "jumprelu": "#8a6d0e", "matryoshka": "#2f9e44",
    "matryoshka_prefix": "#d9480f",
}
#: CEDAR trained at several k: shades of its colour, one per trained k
CEDAR_SHADES = ["#2458c6", "#5b8def", "#0b2e7a", "#93b4f5"]
FALLBACK_COLOURS = ["#364fc7", "#087f5b", "#e67700", "#862e9c", "#c92a2a", "#495057"]


def method_colour(method: str) -> str:
    """The method's colour (a fixed palette for the known methods, a stable fallback for others)."""
    return METHOD_COLOURS.get(method, FALLBACK_COLOURS[sum(map(ord, method)) % len(FALLBACK_COLOURS)])


def _log2_ticks(values: list[float]) -> list[float]:
    """Powers of two spanning `values`, so a log axis gets readable, non-colliding labels."""
    positive = [v for v in values if v and v > 0]
    if not positive:
        return []
    low, high = int(np.floor(np.log2(min(positive)))), int(np.ceil(np.log2(max(positive))))
    return [float(2**e) for e in range(low, high + 1)]


def _rotation_curves(curves: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """(label, model) -> points of the rotation runs. A fixed basis traces the same curve whatever k its cell names,
    so it is drawn once; CEDAR is trained at each k and drawn per trained k."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for point in curves:
        if not point.get("rotation"):
            continue
        trained_k = point["run"].rsplit("-", 1)[-1]
        label = f"{point['method']} (trained at k={trained_k})" if point["method"] == "cedar" else point["method"]
        key = (label, point["model"])
        if key in groups and groups[key][0]["run"] != point["run"]:
            continue  # the same fixed basis from another cell
        groups.setdefault(key, []).append(point)
    return groups


def fvu_vs_k(curves: list[dict[str, Any]]) -> go.Figure:
    """The headline reconstruction comparison: FVU against K (mean active latents), two panels.

    Left: the rotations of the embedding space (CEDAR per trained k, the fixed bases once each). Right: one line
    per SAE method across its k at one dictionary size (buttons switch the size), with CEDAR's curves as dashed
    references. Untrained twins form one legend entry, hidden until clicked."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=["rotations of the embedding space (d latents)", "sparse autoencoders"],
                        horizontal_spacing=0.08)
    shown_twin = False
    cedar_labels = sorted({label for label, _ in _rotation_curves(curves) if label.startswith("cedar")})
    for (label, model), points in sorted(_rotation_curves(curves).items()):
        points = sorted(points, key=lambda p: p["K"])
        method = points[0]["method"]
        trained = model == "trained"
        colour = CEDAR_SHADES[cedar_labels.index(label) % len(CEDAR_SHADES)] if method == "cedar" else method_colour(method)
        for col in (1, 2) if (method == "cedar" and trained) else (1,):
            fig.add_trace(go.Scatter(
                x=[p["K"] for p in points], y=[p["fvu"] for p in points], mode="lines+markers", name=label if trained else "untrained twins",
                legendgroup=label if trained else "untrained", showlegend=(trained and col == 1) or (not trained and not shown_twin),
                line={"color": colour, "dash": "solid" if trained and col == 1 else "dash"},
                marker={"size": 5}, opacity=1.0 if trained else 0.6, visible=True if trained else "legendonly",
                hovertemplate=f"{label} ({model})<br>K=%{{x:.2f}}<br>FVU=%{{y:.4f}}<extra></extra>"), row=1, col=col)
            shown_twin |= not trained
    sae = [p for p in curves if not p.get("rotation")]
    sizes = sorted({p["size"] for p in sae})
    n_fixed = len(fig.data)
    for size in sizes:
        for (method, model) in sorted({(p["method"], p["model"]) for p in sae if p["size"] == size}):
            points = sorted((p for p in sae if p["size"] == size and p["method"] == method and p["model"] == model), key=lambda p: p["K"])
            trained = model == "trained"
            fig.add_trace(go.Scatter(
                x=[p["K"] for p in points], y=[p["fvu"] for p in points], mode="lines+markers", name=method if trained else "untrained twins",
                legendgroup=method if trained else "untrained", showlegend=trained or not shown_twin,
                line={"color": method_colour(method), "dash": "solid" if trained else "dot"}, marker={"size": 6},
                opacity=1.0 if trained else 0.6, visible=(True if trained else "legendonly") if size == sizes[len(sizes) // 2] else False,
                meta=size, hovertemplate=f"{method} {size} latents ({model})<br>K=%{{x:.2f}}<br>FVU=%{{y:.4f}}<extra></extra>"), row=1, col=2)
            shown_twin |= not trained
    if len(sizes) > 1:
        buttons = []
        for size in sizes:
            visible = [trace.visible for trace in fig.data[:n_fixed]]
            visible += [(True if trace.legendgroup != "untrained" else "legendonly") if trace.meta == size else False for trace in fig.data[n_fixed:]]
            buttons.append({"label": f"{size} latents", "method": "restyle", "args": [{"visible": visible}]})
        fig.update_layout(updatemenus=[{"type": "buttons", "direction": "right", "x": 1.0, "xanchor": "right", "y": 1.12, "yanchor": "bottom",
                                        "buttons": buttons, "active": len(sizes) // 2, "showactive": True}])
    ticks = _log2_ticks([p["K"] for p in curves])
    fig.update_xaxes(type="log", title_text="K (mean active latents, L0)", tickvals=ticks, ticktext=[f"{t:g}" for t in ticks])
    fig.update_yaxes(title_text="FVU (test split)", rangemode="tozero", row=1, col=1)
    fig.update_layout(template="plotly_white", height=500, margin={"t": 100}, legend={"orientation": "h", "y": -0.22})
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


def _methods_in_order(runs: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["method"] for r in runs))


def sanity_summary(runs: list[dict[str, Any]], kind: str) -> go.Figure:
    """The sanity check at a glance: per method, the mean over its runs of each concept metric for trained,
    untrained and random codes, with the range over runs as error bars. Only metrics on which trained codes stand
    clear of both baselines measure what was learned (TAPAScore and FBMP matching, in the published finding)."""
    from plotly.subplots import make_subplots

    methods = _methods_in_order(runs)
    fig = make_subplots(rows=1, cols=len(SANITY_METRICS), subplot_titles=[title for _, title in SANITY_METRICS], horizontal_spacing=0.05)
    for col, (key, _) in enumerate(SANITY_METRICS, start=1):
        for variant, colour in VARIANT_COLOURS.items():
            means, lows, highs = [], [], []
            for method in methods:
                values = [v for r in runs if r["method"] == method
                          if (v := sanity_value(r["concepts"][kind][variant], key)) is not None and v == v]
                mean = float(np.mean(values)) if values else None
                means.append(mean)
                lows.append(mean - min(values) if values else 0.0)
                highs.append(max(values) - mean if values else 0.0)
            fig.add_trace(go.Bar(x=methods, y=means, name=variant, marker_color=colour, legendgroup=variant, showlegend=col == 1,
                                 error_y={"type": "data", "symmetric": False, "array": highs, "arrayminus": lows, "thickness": 1},
                                 hovertemplate=f"%{{x}}<br>{variant}: %{{y:.3f}} (mean over runs)<extra></extra>"), row=1, col=col)
    fig.update_xaxes(tickangle=-45)
    fig.update_layout(barmode="group", template="plotly_white", height=440, margin={"t": 80, "b": 110},
                      legend={"orientation": "h", "y": 1.25, "x": 0})
    return fig


def sanity_panel(runs: list[dict[str, Any]], kind: str) -> go.Figure:
    """Every run's trained / untrained / random value of each concept metric, runs grouped by method (the detail
    behind `sanity_summary`)."""
    from plotly.subplots import make_subplots

    ordered = sorted(runs, key=lambda r: (_methods_in_order(runs).index(r["method"]), r["size"], r["k"]))
    names = [r["run"] for r in ordered]
    fig = make_subplots(rows=len(SANITY_METRICS), cols=1, shared_xaxes=True, vertical_spacing=0.03,
                        subplot_titles=[title for _, title in SANITY_METRICS])
    for row, (key, _) in enumerate(SANITY_METRICS, start=1):
        for variant, colour in VARIANT_COLOURS.items():
            values = [sanity_value(r["concepts"][kind][variant], key) for r in ordered]
            fig.add_trace(go.Bar(x=names, y=values, name=variant, marker_color=colour, legendgroup=variant, showlegend=row == 1,
                                 hovertemplate=f"%{{x}}<br>{variant}: %{{y:.3f}}<extra></extra>"), row=row, col=1)
    fig.update_xaxes(tickangle=-60, tickfont={"size": 10}, row=len(SANITY_METRICS), col=1)
    fig.update_layout(barmode="group", template="plotly_white", height=220 * len(SANITY_METRICS) + 80, margin={"t": 40, "b": 120},
                      bargap=0.25, legend={"orientation": "h", "y": 1.04, "x": 0})
    return fig


def scores_vs_size(runs: list[dict[str, Any]], kind: str) -> go.Figure:
    """Concept scores against the number of latents: MATCHScore, Delta-MATCHScore and TAPAScore of the trained
    models, one line per SAE method across dictionary sizes at one k (buttons switch k), and the rotation methods
    (d latents, dimension-preserving) as markers at their size."""
    from plotly.subplots import make_subplots

    series = [("MATCHScore (FBMP)", lambda c: c["trained"]["match_score"]), ("Delta-MATCHScore", lambda c: c["delta_match_score"]),
              ("TAPAScore", lambda c: sanity_value(c["trained"], "tapas"))]
    fig = make_subplots(rows=1, cols=len(series), subplot_titles=[title for title, _ in series], horizontal_spacing=0.06)
    ks = sorted({r["k"] for r in runs if not r["rotation"]})
    chosen = ks[len(ks) // 2] if ks else None
    for col, (_, value) in enumerate(series, start=1):
        for method in _methods_in_order(runs):
            members = [r for r in runs if r["method"] == method]
            rotation = members[0]["rotation"]
            for k in ([None] if rotation else ks):
                group = sorted((r for r in members if rotation or r["k"] == k), key=lambda r: (r["size"], r["k"]))
                if not group:
                    continue
                fig.add_trace(go.Scatter(
                    x=[r["size"] for r in group], y=[value(r["concepts"][kind]) for r in group],
                    mode="markers" if rotation else "lines+markers", name=method, legendgroup=method, showlegend=col == 1 and (rotation or k == chosen),
                    marker={"color": method_colour(method), "size": 9 if rotation else 6, "symbol": "diamond" if rotation else "circle"},
                    line={"color": method_colour(method)}, visible=True if rotation or k == chosen else False, meta=k,
                    text=[r["run"] for r in group], hovertemplate="%{text}<br>%{x} latents<br>%{y:.3f}<extra></extra>"), row=1, col=col)
    if len(ks) > 1:
        buttons = [{"label": f"k = {k}", "method": "restyle",
                    "args": [{"visible": [True if trace.meta is None or trace.meta == k else False for trace in fig.data]}]} for k in ks]
        fig.update_layout(updatemenus=[{"type": "buttons", "direction": "right", "x": 1.0, "xanchor": "right", "y": 1.14, "yanchor": "bottom",
                                        "buttons": buttons, "active": ks.index(chosen), "showactive": True}])
    sizes = sorted({r["size"] for r in runs})
    fig.update_xaxes(type="log", title_text="latents (dictionary size; rotations: d)", tickvals=sizes, ticktext=[str(v) for v in sizes])
    fig.update_layout(template="plotly_white", height=460, margin={"t": 110}, legend={"orientation": "h", "y": -0.25})
    return fig


def zero_shot_confusion(zero_shot: dict[str, dict[str, Any]], values: dict[str, list[str]]) -> go.Figure:
    """One confusion matrix per attribute family of the encoder's zero-shot classification (rows: the true value,
    columns: the predicted one; each row normalised to the fraction of its images)."""
    from plotly.subplots import make_subplots

    families = [f for f in zero_shot if zero_shot[f].get("confusion")]
    columns = min(4, max(1, len(families)))
    rows = -(-len(families) // columns) or 1
    fig = make_subplots(rows=rows, cols=columns, subplot_titles=[f"{f} ({zero_shot[f]['accuracy']:.2f})" for f in families],
                        horizontal_spacing=0.09, vertical_spacing=0.16)
    for i, family in enumerate(families):
        counts = np.asarray(zero_shot[family]["confusion"], dtype=float)
        share = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
        names = values.get(family) or [str(j) for j in range(len(counts))]
        fig.add_trace(go.Heatmap(z=share, x=names, y=names, zmin=0, zmax=1, colorscale="Blues", showscale=i == 0,
                                 customdata=counts, hovertemplate="true %{y}<br>predicted %{x}<br>%{z:.2f} (%{customdata:.0f} images)<extra></extra>"),
                      row=i // columns + 1, col=i % columns + 1)
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(tickangle=-45, tickfont={"size": 10})
    fig.update_yaxes(tickfont={"size": 10})
    fig.update_layout(template="plotly_white", height=300 * rows + 40, margin={"t": 40})
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
