"""Stage `report`: the self-contained HTML report from the metrics the earlier stages wrote.

Reads store/metrics/encoder.json, store/eval/*/metrics.json, fvu_curve.json and explain.json, store/data
(meta.json; the images shown as thumbnails) and params.yaml; writes reports/index.html (atomically).
Recomputes nothing. Reads params: sweep, report.
"""

from __future__ import annotations

import json
import logging

import numpy as np

from pipeline.atomic import atomic_file
from pipeline.config import Params, load_params
from pipeline.data.dataset import Dataset, edit_text, open_dataset
from pipeline.paths import Layout
from pipeline.provenance import code_digest
from pipeline.report import figures
from pipeline.report.render import ReportData, render
from pipeline.report.tables import best_runs, conventions, example_table, family_separation, latent_browser, rates_table, report_images, separation
from pipeline.report.thumbnails import png_data_uri
from stages.runner import exit_with, parser, run_main

log = logging.getLogger(__name__)


def family_values(data: Dataset) -> dict[str, list[str]]:
    """Family -> the names of its values (attribute names, in column order), over every kind."""
    names = data.attribute_names
    return {family: [names[c] for c in columns] for kind in data.kinds for family, columns in data.families(kind).items()}


def example_pairs(data: Dataset, per_kind: int = 6) -> list[dict]:
    """The first pairs of each kind with their edit in words and both images as data URIs (none without images)."""
    pairs, names = data.pairs, data.attribute_names
    examples: list[dict] = []
    if not data.has_images:
        return examples
    for kind in data.kinds:
        for i in pairs.of_kind(kind)[:per_kind]:
            removed, added = int(pairs.removed[i]), int(pairs.added[i])
            edit = edit_text(names, removed, added)
            examples.append({"kind": kind, "family": pairs.family[i], "edit": edit,
                             "before": png_data_uri(pairs.before.read(i, i + 1)[0]), "after": png_data_uri(pairs.after.read(i, i + 1)[0])})
    return examples


#: thumbnail size (px) and palette of the images in the latent list and the examples: small, so that the page
#: stays a few MB with a few hundred distinct test images (each is inlined once, see render.image_css)
THUMBNAIL_PX = 64
THUMBNAIL_COLOURS = 64


def thumbnails(data: Dataset, rows: list[int], pairs: list[int]) -> dict[str, str]:
    """Data URIs of dataset rows ("r<row>") and of both images of pairs ("p<i>b", "p<i>a"), THUMBNAIL_PX wide (none
    for a dataset without images: the report then shows row numbers only)."""
    images: dict[str, str] = {}
    if not data.has_images:
        return images
    if rows:
        for row, image in zip(rows, data.images.take(np.asarray(rows, dtype=np.int64))):
            images[f"r{row}"] = png_data_uri(image, THUMBNAIL_PX, THUMBNAIL_COLOURS)
    if pairs:
        index = np.asarray(pairs, dtype=np.int64)
        for i, before, after in zip(pairs, data.pairs.before.take(index), data.pairs.after.take(index)):
            images[f"p{i}b"] = png_data_uri(before, THUMBNAIL_PX, THUMBNAIL_COLOURS)
            images[f"p{i}a"] = png_data_uri(after, THUMBNAIL_PX, THUMBNAIL_COLOURS)
    return images


def run(params: Params, layout: Layout, params_text: str) -> str:
    data = open_dataset(layout.data)
    encoder = json.loads(layout.encoder_metrics.read_text())
    planted = json.loads(layout.planted_metrics.read_text()) if layout.planted_metrics.is_file() else []
    runs, curves, explains = [], [], {}
    for cell in params.cells():
        for path in (layout.run_metrics(cell.name), layout.run_explanations(cell.name), layout.run_curve(cell.name)):
            if not path.is_file():
                raise FileNotFoundError(f"{path}: missing; run `dvc repro` ({'rotation' if cell.rotation else 'sae'}@{cell.name})")
        metrics = json.loads(layout.run_metrics(cell.name).read_text())
        runs.append(metrics)
        explains[cell.name] = json.loads(layout.run_explanations(cell.name).read_text())
        for point in json.loads(layout.run_curve(cell.name).read_text()):
            curves.append({**point, "size": metrics["size"], "rotation": cell.rotation})
    best = best_runs(runs)
    browser = latent_browser(runs, explains, best)
    examples = example_table(explains, best)
    rates = rates_table(list(explains.values()))
    best_rates = {kind: [r for r in rows if best.get(r["method"]) == r["run"]] for kind, rows in rates.items()}
    best_rotations = [explains[name] for name in best.values() if explains[name]["describes_curve"]]
    report = ReportData(
        title=params.report.title,
        code_version=code_digest(("pipeline", "stages")),  # the code's content, not the commit: same code, same bytes
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
            **({"zero_shot_confusion": figures.zero_shot_confusion(encoder["zero_shot"], family_values(data))}
               if any("confusion" in row for row in encoder["zero_shot"].values()) else {}),
            **{f"scores_{kind}": figures.scores_vs_size(runs, kind) for kind in data.kinds},
            **{f"sanity_summary_{kind}": figures.sanity_summary(runs, kind) for kind in data.kinds},
            **{f"sanity_{kind}": figures.sanity_panel(runs, kind) for kind in data.kinds},
            **{f"explain_{kind}": figures.explanation_rates(rows, kind) for kind, rows in best_rates.items()},
            **{f"describes_k_{kind}": figures.describes_vs_k(best_rotations, kind) for kind in rates if best_rotations},
        },
        latent_browser=browser,
        examples=examples,
        rates=rates,
        images=thumbnails(data, *report_images(browser, examples)),
        separation={kind: separation(runs, kind) for kind in data.kinds},
        family_separation={kind: family_separation(runs, kind, encoder["zero_shot"]) for kind in data.kinds},
        conventions=conventions(params.evaluate, {m: params.method_options(m) for m in dict.fromkeys(c.method for c in params.cells())}),
    )
    html = render(report)
    with atomic_file(layout.report) as tmp:
        tmp.write_text(html, encoding="utf-8")
    log.info("wrote %s (%d runs)", layout.report, len(runs))
    return html


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    return run_main("report", lambda: run(load_params(args.params), Layout(args.root), args.params.read_text()))


if __name__ == "__main__":
    exit_with(main())
