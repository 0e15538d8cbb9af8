"""Stage `report`: the self-contained HTML report from the metrics the earlier stages wrote.

Reads store/metrics/encoder.json, store/eval/*/metrics.json and fvu_curve.json, store/data/meta.json
and params.yaml; writes reports/index.html (atomically). Recomputes nothing.
"""

from __future__ import annotations

import json
import logging
import os

from pipeline.config import Params, load_params
from pipeline.dataset import Dataset, open_dataset
from pipeline.paths import Layout
from pipeline.provenance import code_version
from pipeline.report import figures
from pipeline.report.render import ReportData, render
from pipeline.report.thumbnails import png_data_uri
from stages._cli import exit_with, parser, run_main

log = logging.getLogger(__name__)


def example_pairs(data: Dataset, per_kind: int = 6) -> list[dict]:
    """The first pairs of each kind with their edit in words and both images as data URIs."""
    pairs, names = data.pairs, data.attribute_names
    examples = []
    for kind in data.kinds:
        for i in pairs.of_kind(kind)[:per_kind]:
            removed, added = int(pairs.removed[i]), int(pairs.added[i])
            edit = f"{names[removed]} → {names[added]}" if added >= 0 else f"{names[removed]} removed"
            examples.append({"kind": kind, "family": pairs.family[i], "edit": edit,
                             "before": png_data_uri(pairs.before.read(i, i + 1)[0]), "after": png_data_uri(pairs.after.read(i, i + 1)[0])})
    return examples


def run(params: Params, layout: Layout, params_text: str) -> str:
    data = open_dataset(layout.data)
    encoder = json.loads(layout.encoder_metrics.read_text())
    planted = json.loads(layout.planted_metrics.read_text()) if layout.planted_metrics.is_file() else []
    runs, curves = [], []
    for cell in params.runs():
        directory = layout.evals / cell.name
        if not (directory / "metrics.json").is_file():
            raise FileNotFoundError(f"{directory / 'metrics.json'}: missing; run `dvc repro` (evaluate@{cell.name})")
        metrics = json.loads((directory / "metrics.json").read_text())
        runs.append(metrics)
        for point in json.loads((directory / "fvu_curve.json").read_text()):
            curves.append({**point, "size": metrics["size"], "rotation": cell.rotation})
    report = ReportData(
        title=params.report.title,
        code_version=code_version(layout.root),
        params_yaml=params_text,
        dataset={"kinds": {k: {"n": v["n"], "n_attributes": len(v["columns"]), "one_hot": v["one_hot"]} for k, v in data.meta["kinds"].items()},
                 "n": data.meta["n"], "n_attributes": len(data.attribute_names)},
        encoder=encoder,
        runs=runs,
        planted=planted,
        pairs=example_pairs(data),
        figures={
            "fvu_vs_k": figures.fvu_vs_k(curves),
            "zero_shot": figures.zero_shot(encoder["zero_shot"]),
            **{f"sanity_{kind}": figures.sanity_panel(runs, kind) for kind in data.kinds},
            **{f"scores_{kind}": figures.scores_vs_size(runs, kind) for kind in data.kinds if any(not r["rotation"] for r in runs)},
        },
    )
    html = render(report)
    layout.report.parent.mkdir(parents=True, exist_ok=True)
    tmp = layout.report.with_name(layout.report.name + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, layout.report)
    log.info("wrote %s (%d runs)", layout.report, len(runs))
    return html


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    return run_main("report", lambda: run(load_params(args.params), Layout(args.root), args.params.read_text()))


if __name__ == "__main__":
    exit_with(main())
