"""Stage `report`: the self-contained HTML report from the metrics the earlier stages wrote.

Reads store/metrics/encoder.json, store/eval/*/metrics.json, fvu_curve.json and explain.json, store/data
(meta.json; the images shown as thumbnails) and params.yaml; writes reports/index.html (atomically).
Recomputes nothing. Reads params: sweep, report. The page carries the git commit, the devices and the library
versions; its build time is the file's own modification time, which the page's script shows (document.lastModified),
so the same records, code and environment still give the same bytes (a rerun of the stage changes nothing DVC sees).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
from collections import Counter
from importlib import metadata
from typing import Any

import numpy as np

from pipeline.atomic import atomic_file
from pipeline.config import Params, load_params
from pipeline.data.dataset import Dataset, edit_text, open_dataset
from pipeline.paths import Layout
from pipeline.provenance import code_digest
from pipeline.report import figures, headline
from pipeline.report.render import ReportData, render
from pipeline.report.tables import (
    best_runs,
    confusion,
    conventions,
    example_table,
    explorer,
    family_separation,
    learned,
    rates_table,
    report_images,
    separation,
)
from pipeline.report.thumbnails import sprite
from stages.runner import exit_with, parser, run_main

log = logging.getLogger(__name__)

#: the libraries whose versions the provenance lists
LIBRARIES = ("torch", "numpy", "scipy", "scikit-learn", "plotly", "dvc", "prefect", "zarr", "transformers", "open_clip_torch")


def family_values(data: Dataset) -> dict[str, list[str]]:
    """Family -> the names of its values (attribute names, in column order), over every kind."""
    names = data.attribute_names
    return {family: [names[c] for c in columns] for kind in data.kinds for family, columns in data.families(kind).items()}


def example_pairs(data: Dataset, per_kind: int = 6) -> list[dict[str, Any]]:
    """The first pairs of each kind with their edit in words (none without images)."""
    pairs, names = data.pairs, data.attribute_names
    if not data.has_images:
        return []
    return [{"kind": kind, "pair": int(i), "family": pairs.family[i], "edit": edit_text(names, int(pairs.removed[i]), int(pairs.added[i]))}
            for kind in data.kinds for i in pairs.of_kind(kind)[:per_kind]]


#: thumbnail tile size (px): the scenes' own resolution on the default preset; the page scales tiles up (pixelated)
THUMBNAIL_PX = 64
#: tiles per row of the sprite
SPRITE_COLUMNS = 32
#: example images shown per kind (explain.json holds `explain.examples`; each adds a row per method and k, ~13 kB)
EXAMPLES_PER_KIND = 5


def thumbnails(data: Dataset, rows: list[int], pairs: list[int]) -> tuple[str | None, dict[str, int]]:
    """One WebP sprite of the dataset rows ("r<row>") and both images of the pairs ("p<i>b", "p<i>a"), THUMBNAIL_PX a
    tile, and each key's tile index (None and no tiles for a dataset without images: the report then shows row numbers)."""
    if not data.has_images or not (rows or pairs):
        return None, {}
    keys, images = [], []
    if rows:
        keys += [f"r{row}" for row in rows]
        images.append(data.images.take(np.asarray(rows, dtype=np.int64)))
    if pairs:
        index = np.asarray(pairs, dtype=np.int64)
        keys += [f"p{i}{side}" for side in "ba" for i in pairs]
        images += [data.pairs.before.take(index), data.pairs.after.take(index)]
    return sprite(np.concatenate(images), THUMBNAIL_PX, SPRITE_COLUMNS), {key: i for i, key in enumerate(keys)}


def git_commit(root: Any) -> str | None:
    """The checkout's commit, with "+ uncommitted changes" when the code (pipeline/, stages/: what the code digest
    covers) differs from it, or None outside a git checkout. dvc.lock and params.yaml are left out: `dvc repro` rewrites
    the lock while it runs, and the params are in the page."""
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", "pipeline", "stages"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return commit.stdout.strip() + (" + uncommitted changes" if dirty.stdout.strip() else "")


def provenance(encoder: dict[str, Any], runs: list[dict[str, Any]], root: Any) -> dict[str, Any]:
    """What made this report: the code digest, the git commit, the devices the stages recorded (encoder.json, each
    run's metrics.json), the library versions and what is known of the training time (the build time is the page's
    own: its file's modification time)."""
    import torch

    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    devices = Counter(str(metrics.get("device", "not recorded")) for metrics in runs)
    here = f"cuda ({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else "cpu"
    return {
        "code_digest": code_digest(("pipeline", "stages")),
        "git_commit": git_commit(root),
        "device": f"encoder stage: {encoder.get('device', 'not recorded')} · grid cells: "
                  + ", ".join(f"{device} ({count} runs)" for device, count in sorted(devices.items()))
                  + f" · report built on: {here} ({platform.machine()}, {os.cpu_count()} CPUs)",
        "versions": versions,
        "training_time": "not in this page, whose bytes must not change from run to run: each run's training and evaluation "
                         "seconds, part by part, are in store/models/<run>.timings.json and store/timings/<run>.json "
                         "(`cedar runs` lists their totals)",
    }


def explorer_pair(rows: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The two headline rows the latent explorer opens side by side: the highest MATCHScore (objects scenes, as
    `tables.best_score`), and CEDAR at the same k (the runner-up there when CEDAR leads or is not in the sweep)."""
    ranked = sorted((r for r in rows if r["match_score"] is not None), key=lambda r: -r["match_score"])
    if not ranked:
        return None, None
    lead = ranked[0]
    same_k = [r for r in ranked if r["k"] == lead["k"] and r is not lead]
    other = next((r for r in same_k if r["method"] == "cedar"), same_k[0] if same_k else None)
    return lead, other


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
    examples = [e for kind in data.kinds for e in [x for x in example_table(explains, best) if x["kind"] == kind][:EXAMPLES_PER_KIND]]
    rates = rates_table(list(explains.values()))
    best_rates = {kind: [r for r in rows if best.get((r["method"], r["k"])) == r["run"]] for kind, rows in rates.items()}
    by_name = {m["run"]: m for m in runs}
    first_k = {method: min(k for m, k in best if m == method) for method, _ in best}
    best_rotations = [explains[name] for (method, k), name in best.items()  # a fixed basis's curve is the same at every k: once
                      if explains[name]["describes_curve"] and (learned(by_name[name]) or k == first_k[method])]
    rows, pairs = report_images(list(explains.values()))
    shown_pairs = example_pairs(data)
    sheet, tiles = thumbnails(data, rows, sorted(set(pairs) | {p["pair"] for p in shown_pairs}))
    attributes = {kind: [data.attribute_names[c] for c in data.columns(kind)] for kind in data.kinds}
    tables = {kind: headline.headline(runs, kind) for kind in data.kinds}
    lead, other = explorer_pair(tables.get("objects") or next(iter(tables.values()), []))
    report = ReportData(
        title=params.report.title,
        provenance=provenance(encoder, runs, layout.root.resolve()),
        params_yaml=params_text,
        dataset={"kinds": {k: {"n": v["n"], "n_attributes": len(v["columns"]), "one_hot": v["one_hot"]} for k, v in data.meta["kinds"].items()},
                 "n": data.meta["n"], "n_attributes": len(data.attribute_names)},
        encoder=encoder,
        runs=runs,
        planted=planted,
        pairs=[{**p, "before": tiles.get(f"p{p['pair']}b"), "after": tiles.get(f"p{p['pair']}a")} for p in shown_pairs],
        figures={
            **{f"scores_k_{kind}": figures.scores_vs_k(rows_) for kind, rows_ in tables.items() if rows_},
            "fvu_vs_k": figures.fvu_vs_k(curves),
            "zero_shot": figures.zero_shot(encoder["zero_shot"]),
            **{f"scores_{kind}": figures.scores_vs_size(runs, kind) for kind in data.kinds},
            **{f"sanity_summary_{kind}": figures.sanity_summary(runs, kind) for kind in data.kinds},
            **{f"sanity_{kind}": figures.sanity_panel(runs, kind) for kind in data.kinds},
            **{f"explain_{kind}": figures.explanation_rates(rows_, kind) for kind, rows_ in best_rates.items()},
            **{f"describes_k_{kind}": figures.describes_vs_k(best_rotations, kind) for kind in rates if best_rotations},
        },
        headline=tables,
        sentences={kind: headline.sentences(rows_) for kind, rows_ in tables.items()},
        sanity={kind: headline.sanity_sentences(separation(runs, kind)) + headline.delta_sentences(runs, kind, params.evaluate.match_strongest)
                for kind in data.kinds},
        strongest_k=params.evaluate.match_strongest,
        explorer=explorer(runs, explains, attributes, tiles),
        explorer_default=[r["run"] for r in (lead, other) if r is not None],
        examples=examples,
        rates=rates,
        sprite=sheet,
        sprite_columns=SPRITE_COLUMNS,
        tiles=tiles,
        separation={kind: separation(runs, kind) for kind in data.kinds},
        family_separation={kind: family_separation(runs, kind, encoder["zero_shot"]) for kind in data.kinds},
        conventions=conventions(params.evaluate, {m: params.method_options(m) for m in dict.fromkeys(c.method for c in params.cells())}),
        confusion=confusion(encoder["zero_shot"], family_values(data)),
    )
    html = render(report)
    with atomic_file(layout.report) as tmp:
        tmp.write_text(html, encoding="utf-8")
    log.info("wrote %s (%d runs, %.2f MB)", layout.report, len(runs), len(html.encode()) / 1e6)
    return html


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    return run_main("report", lambda: run(load_params(args.params), Layout(args.root), args.params.read_text()))


if __name__ == "__main__":
    exit_with(main())
