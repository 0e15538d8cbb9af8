"""Plotly figures for the report, from the metrics the evaluate stages wrote (no recomputation)."""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go

#: one colour per method, the same in every figure: colour-blind-safe palettes (Okabe-Ito for the rotations, Paul
#: Tol's "muted" for the SAEs), every colour distinct; rotations are also drawn dashed or as diamonds
METHOD_COLOURS = {
    "cedar": "#0072B2", "identity": "#999999", "pca": "#E69F00", "ica": "#009E73", "random_rotation": "#000000",
    "relu": "#AA4499", "topk": "#88CCEE", "batchtopk": "#CC6677", "jumprelu": "#DDCC77", "matryoshka": "#332288",
    "matryoshka_prefix": "#117733",
}
#: CEDAR trained at several k: shades of its blue, one per trained k
CEDAR_SHADES = ["#0072B2", "#003A5C", "#5AA6D6", "#001F33"]
FALLBACK_COLOURS = ["#882255", "#44AA99", "#999933", "#56B4E9", "#D55E00", "#CC79A7"]
#: what every figure passes to plotly: no cloud upload, no logo link (the page stays offline)
CONFIG = {"responsive": True, "displaylogo": False, "showSendToCloud": False, "showEditInChartStudio": False,
          "modeBarButtonsToRemove": ["sendDataToCloud", "select2d", "lasso2d"], "plotlyServerURL": ""}


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
    """The headline reconstruction comparison: FVU against K (mean active latents), one panel for the rotations of the
    embedding space (CEDAR per trained k, the fixed bases once each) and one per SAE dictionary size (one line per
    method across its k), with CEDAR's curves dashed in every SAE panel as a reference. Panels, not buttons: nothing
    the reader turned on is turned off again. Untrained twins form one legend entry, hidden until clicked."""
    from plotly.subplots import make_subplots

    sae = [p for p in curves if not p.get("rotation")]
    sizes = sorted({p["size"] for p in sae})
    fig = make_subplots(rows=1, cols=1 + len(sizes), horizontal_spacing=0.05, shared_yaxes=True,
                        subplot_titles=["rotations (d latents)"] + [f"SAEs, {size} latents" for size in sizes])
    shown_twin = False
    rotations = _rotation_curves(curves)
    cedar_labels = sorted({label for label, _ in rotations if label.startswith("cedar")})
    for (label, model), points in sorted(rotations.items()):
        points = sorted(points, key=lambda p: p["K"])
        method = points[0]["method"]
        trained = model == "trained"
        colour = CEDAR_SHADES[cedar_labels.index(label) % len(CEDAR_SHADES)] if method == "cedar" else method_colour(method)
        for col in range(1, 2 + len(sizes)) if (method == "cedar" and trained) else (1,):
            fig.add_trace(go.Scatter(
                x=[p["K"] for p in points], y=[p["fvu"] for p in points], mode="lines+markers", name=label if trained else "untrained twins",
                legendgroup=label if trained else "untrained", showlegend=(trained and col == 1) or (not trained and not shown_twin),
                line={"color": colour, "dash": "solid" if trained and col == 1 else "dash", "width": 2 if col == 1 else 1},
                marker={"size": 5, "symbol": "diamond"}, opacity=1.0 if trained else 0.6, visible=True if trained else "legendonly",
                hovertemplate=f"{label} ({model})<br>K=%{{x:.2f}}<br>FVU=%{{y:.4f}}<extra></extra>"), row=1, col=col)
            shown_twin |= not trained
    for col, size in enumerate(sizes, start=2):
        for method, model in sorted({(p["method"], p["model"]) for p in sae if p["size"] == size}):
            points = sorted((p for p in sae if p["size"] == size and p["method"] == method and p["model"] == model), key=lambda p: p["K"])
            trained = model == "trained"
            fig.add_trace(go.Scatter(
                x=[p["K"] for p in points], y=[p["fvu"] for p in points], mode="lines+markers", name=method if trained else "untrained twins",
                legendgroup=method if trained else "untrained", showlegend=(trained and col == 2) or (not trained and not shown_twin),
                line={"color": method_colour(method), "dash": "solid" if trained else "dot"}, marker={"size": 6},
                opacity=1.0 if trained else 0.6, visible=True if trained else "legendonly", meta=size,
                hovertemplate=f"{method} {size} latents ({model})<br>K=%{{x:.2f}}<br>FVU=%{{y:.4f}}<extra></extra>"), row=1, col=col)
            shown_twin |= not trained
    ticks = _log2_ticks([p["K"] for p in curves])
    fig.update_xaxes(type="log", title_text="K (mean active latents)", tickvals=ticks, ticktext=[f"{t:g}" for t in ticks])
    fig.update_yaxes(title_text="FVU (test split, lower is better)", rangemode="tozero", row=1, col=1)
    fig.update_layout(template="plotly_white", height=460, margin={"t": 40, "l": 60, "r": 20}, legend={"orientation": "h", "y": -0.22})
    return fig


def zero_shot(accuracy: dict[str, dict[str, float]]) -> go.Figure:
    """Zero-shot accuracy per attribute family against chance."""
    families = list(accuracy)
    fig = go.Figure([
        go.Bar(x=families, y=[accuracy[f]["accuracy"] for f in families], name="zero-shot accuracy", marker_color=METHOD_COLOURS["cedar"]),
        go.Bar(x=families, y=[accuracy[f]["chance"] for f in families], name="chance", marker_color=METHOD_COLOURS["identity"]),
    ])
    fig.update_layout(yaxis_title="accuracy (test split)", yaxis_range=[0, 1], barmode="group", template="plotly_white",
                      height=360, margin={"t": 30})
    return fig


VARIANT_COLOURS = {"trained": "#0072B2", "untrained": "#E69F00", "random": "#999999"}
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


SCORE_SERIES = (("MATCHScore (FBMP)", lambda c: c["trained"]["match_score"]), ("Delta-MATCHScore", lambda c: c["delta_match_score"]),
                 ("TAPAScore", lambda c: sanity_value(c["trained"], "tapas")))


def scores_vs_size(runs: list[dict[str, Any]], kind: str) -> go.Figure:
    """Concept scores against the number of latents at one k (buttons switch k): MATCHScore, Delta-MATCHScore and
    TAPAScore of the trained models, one line per SAE method across dictionary sizes, and each rotation method (d
    latents) as a dashed horizontal reference line at its value for that k (fixed bases not in the Delta panel: they
    train nothing). Every trace of a method carries its legend entry, so switching k keeps every method in the legend."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=len(SCORE_SERIES), subplot_titles=[title for title, _ in SCORE_SERIES], horizontal_spacing=0.06)
    ks = sorted({r["k"] for r in runs})
    chosen = ks[0] if ks else None
    sizes = sorted({r["size"] for r in runs if not r["rotation"]}) or sorted({r["size"] for r in runs})
    span = [sizes[0], sizes[-1]] if sizes else []
    for col, (title, value) in enumerate(SCORE_SERIES, start=1):
        for method in _methods_in_order(runs):
            for k in ks:
                group = sorted((r for r in runs if r["method"] == method and r["k"] == k), key=lambda r: r["size"])
                if not group or (title == "Delta-MATCHScore" and not any(r.get("best_epoch") for r in group)):
                    continue  # a fixed basis has no Delta-MATCHScore (0 by construction): not drawn as if it scored 0
                rotation = group[0]["rotation"]
                y = [value(r["concepts"][kind]) for r in group]
                fig.add_trace(go.Scatter(
                    x=span if rotation else [r["size"] for r in group], y=[y[0]] * 2 if rotation else y,
                    mode="lines" if rotation else "lines+markers", name=method, legendgroup=method, showlegend=col == 1,
                    line={"color": method_colour(method), "dash": "dash" if rotation else "solid"}, marker={"size": 7},
                    visible=k == chosen, meta=k, text=[group[0]["run"]] * 2 if rotation else [r["run"] for r in group],
                    hovertemplate=("%{text} (rotation: d latents)<br>%{y:.3f}<extra></extra>" if rotation
                                   else "%{text}<br>%{x} latents<br>%{y:.3f}<extra></extra>")), row=1, col=col)
    if len(ks) > 1:
        buttons = [{"label": f"k = {k}", "method": "restyle", "args": [{"visible": [trace.meta == k for trace in fig.data]}]} for k in ks]
        fig.update_layout(updatemenus=[{"type": "buttons", "direction": "right", "x": 1.0, "xanchor": "right", "y": 1.16, "yanchor": "bottom",
                                        "buttons": buttons, "active": 0, "showactive": True}])
    fig.update_xaxes(type="log", title_text="SAE dictionary size", tickvals=sizes, ticktext=[str(v) for v in sizes])
    fig.update_layout(template="plotly_white", height=430, margin={"t": 90, "l": 50, "r": 20}, legend={"orientation": "h", "y": -0.28})
    return fig


def scores_vs_k(rows: list[dict[str, Any]]) -> go.Figure:
    """MATCHScore and TAPAScore against k, one line per method through its best run at each k (the headline table's
    rows, `tables.headline`); rotations dashed with diamonds."""
    from plotly.subplots import make_subplots

    series = (("match_score", "MATCHScore (FBMP), higher is better"), ("tapas", "TAPAScore, higher is better"))
    fig = make_subplots(rows=1, cols=len(series), subplot_titles=[title for _, title in series], horizontal_spacing=0.08)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    for col, (key, _) in enumerate(series, start=1):
        for method in methods:
            group = sorted((r for r in rows if r["method"] == method), key=lambda r: r["k"])
            rotation = group[0]["rotation"]
            fig.add_trace(go.Scatter(
                x=[r["k"] for r in group], y=[r[key] for r in group], mode="lines+markers", name=method, legendgroup=method,
                showlegend=col == 1, line={"color": method_colour(method), "dash": "dash" if rotation else "solid"},
                marker={"size": 8, "symbol": "diamond" if rotation else "circle"}, text=[r["run"] for r in group],
                hovertemplate="%{text}<br>k=%{x}<br>%{y:.3f}<extra></extra>"), row=1, col=col)
    ks = sorted({r["k"] for r in rows})
    fig.update_xaxes(type="log", title_text="k (active latents per image)", tickvals=ks, ticktext=[str(k) for k in ks])
    fig.update_layout(template="plotly_white", height=380, margin={"t": 40, "l": 50, "r": 20}, legend={"orientation": "h", "y": -0.3})
    return fig


SOURCE_COLOURS = {"dense": "#999999", "sparse": "#0072B2", "topk_original": "#E69F00"}
SOURCE_NAMES = {"dense": "dense embedding", "sparse": "sparse reconstruction (model, its k)", "topk_original": "top-k in the original basis (same k)"}


def explanation_rates(rows: list[dict[str, Any]], kind: str) -> go.Figure:
    """Per method and k (its best run at that k: runs at different k are never compared in one group), for each caption
    source: the "describes the image" rate and the fraction of stated attributes that are true; where the kind is
    scored, the relevance (precision / recall) of the model's named concepts against the dense reference. One panel
    per measure, stacked, the x axis grouped by k then method. rows: `tables.rates_table(...)[kind]` entries."""
    from plotly.subplots import make_subplots

    rows = sorted(rows, key=lambda r: r["k"])
    scored = any(r["relevance"] for r in rows)
    titles = ['"describes the image" rate', "stated attributes that are true"] + (["relevance of named concepts (top-m)"] if scored else [])
    fig = make_subplots(rows=len(titles), cols=1, subplot_titles=titles, shared_xaxes=True, vertical_spacing=0.07)
    x = [[f"k = {r['k']}" for r in rows], [r["method"] for r in rows]]
    for source, colour in SOURCE_COLOURS.items():
        for row, values in ((1, [r[source] for r in rows]), (2, [(r.get("attribute_precision") or {}).get(source) for r in rows])):
            fig.add_trace(go.Bar(x=x, y=values, name=SOURCE_NAMES[source], marker_color=colour, legendgroup=source, showlegend=row == 1,
                                 customdata=[r["run"] for r in rows], hovertemplate=f"%{{customdata}}<br>{source}: %{{y:.3f}}<extra></extra>"),
                          row=row, col=1)
    if scored:
        series = [("model_precision", "model: precision", "#009E73"), ("model_recall", "model: recall", "#8FD3BD"),
                  ("dense_precision", "dense: precision", "#555555"), ("dense_recall", "dense: recall", "#BBBBBB")]
        for key, name, colour in series:
            fig.add_trace(go.Bar(x=x, y=[(r["relevance"] or {}).get(key) for r in rows], name=name, marker_color=colour,
                                 customdata=[r["run"] for r in rows], hovertemplate=f"%{{customdata}}<br>{name}: %{{y:.3f}}<extra></extra>"),
                          row=3, col=1)
    fig.update_yaxes(range=[0, 1])
    fig.update_xaxes(tickangle=-40, tickfont={"size": 11})
    fig.update_layout(barmode="group", template="plotly_white", height=260 * len(titles) + 160, margin={"t": 70, "b": 110, "l": 50, "r": 20},
                      legend={"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0, "xanchor": "left"})
    return fig


def describes_vs_k(explains: list[dict[str, Any]], kind: str) -> go.Figure:
    """Caption quality against k for rotation runs (one trained rotation serves every k): the "describes the
    image" rate and the fraction of stated attributes that are true, for the model's sparse reconstruction
    (one line per run), top-k in the original basis (the same for every run; drawn once, dashed) and the
    dense embedding (dotted); the runs in their method's colour, the two references in colours no method uses."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=['"describes the image" rate', "stated attributes that are true"])
    baseline: dict[int, dict[str, Any]] = {}
    dense: dict[str, Any] = {}
    cedar_runs = [e["run"] for e in explains if e.get("method") == "cedar"]
    for e in explains:
        points = sorted((p["k"], p) for p in e.get("describes_curve", []) if p["kind"] == kind and p["source"] == "sparse")
        if not points:
            continue
        for col, key in ((1, "rate"), (2, "attribute_precision")):
            fig.add_trace(go.Scatter(x=[k for k, _ in points], y=[p.get(key) for _, p in points], mode="lines+markers", name=f"{e['run']} (sparse)",
                                     line={"color": CEDAR_SHADES[cedar_runs.index(e["run"]) % len(CEDAR_SHADES)] if e["run"] in cedar_runs
                                           else method_colour(e.get("method", ""))}, legendgroup=e["run"], showlegend=col == 1,
                                     hovertemplate=f"{e['run']}<br>k=%{{x}}<br>%{{y:.3f}}<extra></extra>"), row=1, col=col)
        baseline.update({p["k"]: p for p in e["describes_curve"] if p["kind"] == kind and p["source"] == "topk_original"})
        rates = e["describes"].get(kind, {})
        dense = {"rate": rates.get("dense"), "attribute_precision": (rates.get("attribute_precision") or {}).get("dense")}
    ks = sorted(baseline)
    for col, key in ((1, "rate"), (2, "attribute_precision")):
        if ks:
            fig.add_trace(go.Scatter(x=ks, y=[baseline[k].get(key) for k in ks], mode="lines+markers", name="top-k in the original basis",
                                     line={"dash": "dash", "color": "#D55E00"}, legendgroup="topk", showlegend=col == 1),
                          row=1, col=col)
            if dense.get(key) is not None:
                fig.add_trace(go.Scatter(x=[ks[0], ks[-1]], y=[dense[key]] * 2, mode="lines", name="dense embedding", legendgroup="dense",
                                         line={"dash": "dot", "color": "#555555"}, showlegend=col == 1), row=1, col=col)
    fig.update_xaxes(type="log", title_text="k (active coordinates)", tickvals=ks or None)
    fig.update_yaxes(range=[0, 1])
    fig.update_layout(template="plotly_white", height=380, margin={"t": 30})
    return fig
