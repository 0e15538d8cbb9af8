"""Measure what the evaluation conventions change on a finished project (e.g. the default preset after `dvc repro`).

    python bench/conventions_effect.py [--root .] [--cells cedar-8,topk-256-8] [--out effect.json]

For every evaluated cell (or those named), in this process: the cell is evaluated twice from its stored model and
code sets (`pipeline.scoring.cell_evaluation.evaluate_cell`; codes whose fingerprint still holds are reused; nothing but code sets
is written, so run it on a copy of a project whose metrics.json should stay as they are): with the params' `evaluate` settings and with the earlier conventions
(`tapas_empty: zero`, `fms_exhausted: majority`). Printed per cell, kind and code set (trained, untrained, random):
TAPAScore, Delta-stay and FMS under both, the stored metrics.json's values (what the code that wrote them computed),
and the probe scores; then the mean absolute and the largest change of each over everything. One JSON line per
cell and kind, a summary at the end (and in --out).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from pipeline.config import load_params  # noqa: E402
from pipeline.paths import Layout  # noqa: E402

VARIANTS = ("trained", "untrained", "random")


def evaluate_twice(p: Any, layout: Layout, cell: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    from pipeline.data.dataset import open_dataset
    from pipeline.explain.decoder import load_decoder
    from pipeline.models.checkpoint import load_model
    from pipeline.scoring.cell_evaluation import CellInputs, evaluate_cell, untrained_twin
    from pipeline.scoring.concepts import metrics_device
    from pipeline.scoring.probe_files import load_probes
    from pipeline.store import open_store
    from stages.evaluate import metrics_record, read_concepts

    model = load_model(layout.model(cell.name))
    inputs = CellInputs(data=open_dataset(layout.data), embeddings=open_store(layout.image_embeddings),
                        pairs_before=open_store(layout.pair_embeddings("before")), pairs_after=open_store(layout.pair_embeddings("after")),
                        decoder=load_decoder(layout.captions), concepts=read_concepts(layout),
                        probes=load_probes(layout.probes, metrics_device(p.evaluate.device)))
    twin = untrained_twin(cell, model.d, p.method_options(cell.method), inputs.embeddings, inputs.data.rows("train"),
                          p.train_settings(cell.method).init_samples, p.seed)
    explain = dataclasses.replace(p.explain, max_rows=min(p.explain.max_rows, 50))  # explanations are not compared
    published = metrics_record(evaluate_cell(cell, model, twin, inputs, p.evaluate, explain, p.seed, layout.codes(cell.name)))
    earlier = dataclasses.replace(p.evaluate, tapas_empty="zero", fms_exhausted="majority")
    model, twin = load_model(layout.model(cell.name)), untrained_twin(cell, model.d, p.method_options(cell.method), inputs.embeddings,
                                                                      inputs.data.rows("train"), p.train_settings(cell.method).init_samples, p.seed)
    return published, metrics_record(evaluate_cell(cell, model, twin, inputs, earlier, explain, p.seed, layout.codes(cell.name)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("."), help="the project (params.yaml, store/)")
    parser.add_argument("--cells", default=None, help="cells to measure, comma-separated (default: every evaluated cell)")
    parser.add_argument("--out", type=Path, default=None, help="also write the summary here")
    args = parser.parse_args()
    p, layout = load_params(args.root / "params.yaml"), Layout(args.root)
    wanted = set(args.cells.split(",")) if args.cells else None
    cells = [c for c in p.cells() if layout.run_metrics(c.name).exists() and (wanted is None or c.name in wanted)]
    changes: dict[str, list[float]] = {"tapas": [], "delta_stay": [], "fms": [], "fms_vs_stored": [], "tapas_zero_vs_stored": [],
                                       "probe_ce_reconstruction_vs_stored": [], "probe_accuracy_vs_stored": []}
    undefined = {"fms_published": 0, "fms_earlier": 0, "tapas_published": 0}
    for cell in cells:
        stored = json.loads(layout.run_metrics(cell.name).read_text())
        published, earlier = evaluate_twice(p, layout, cell)
        for kind, concepts in published["concepts"].items():
            line: dict[str, Any] = {"cell": cell.name, "kind": kind}
            for variant in VARIANTS:
                new, old, kept = concepts[variant], earlier["concepts"][kind][variant], stored["concepts"][kind][variant]
                tapas = [(r or {}).get("score") for r in (new["tapas"], old["tapas"], kept["tapas"])]
                line[variant] = {"tapas": tapas, "delta_stay": [new["delta_stay"], old["delta_stay"], kept["delta_stay"]],
                                 "fms": [new["fms"], old["fms"], kept["fms"]]}
                pairs = [("tapas", tapas[0], tapas[1]), ("delta_stay", new["delta_stay"], old["delta_stay"]), ("fms", new["fms"], old["fms"]),
                         ("fms_vs_stored", old["fms"], kept["fms"]), ("tapas_zero_vs_stored", tapas[1], tapas[2])]
                if new["probe"] and kept["probe"]:
                    pairs += [("probe_ce_reconstruction_vs_stored", new["probe"]["ce_reconstruction"], kept["probe"]["ce_reconstruction"]),
                              ("probe_accuracy_vs_stored", new["probe"]["accuracy_reconstruction"], kept["probe"]["accuracy_reconstruction"])]
                    line[variant]["probe"] = {"ours": new["probe"], "stored": kept["probe"]}
                for name, a, b in pairs:
                    if a is not None and b is not None and np.isfinite(a) and np.isfinite(b):
                        changes[name].append(abs(a - b))
                undefined["fms_published"] += new["fms"] is None or not np.isfinite(new["fms"])
                undefined["fms_earlier"] += old["fms"] is None or not np.isfinite(old["fms"])
                undefined["tapas_published"] += tapas[0] is None or not np.isfinite(tapas[0])
            print(json.dumps(line, default=float), flush=True)
    summary = {"cells": len(cells), "undefined": undefined,
               **{name: {"n": len(v), "mean_abs": float(np.mean(v)) if v else None, "max_abs": float(np.max(v)) if v else None}
                  for name, v in changes.items()}}
    print(json.dumps(summary), flush=True)
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
