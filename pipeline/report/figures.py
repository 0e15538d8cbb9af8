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
