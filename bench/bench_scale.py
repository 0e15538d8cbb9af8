"""Benchmark: the training and evaluation stages at real sizes, on the synthetic source (no images, no encoder).

    python bench/bench_scale.py [--sizes 100000,400000,1280000] [--d 768] [--dict 16384] [--k 32]
                                [--eval-rows 120000] [--steps 200] [--batch 256] [--train-memory 0.5] [--shuffle-rows 131072]
                                [--stages train,evaluate,steps,fbmp] [--workdir DIR] [--keep]

For every size n: the data stage writes n synthetic embeddings of dimension d (28 one-hot families of 11 values =
308 planted concepts, `pipeline.data.synthetic`) into a scratch project, the encoder, extract and captions stages
run (the captions stage on 2,000 pairs, one epoch: it only has to exist for the explanations), and then each
measured stage runs in its own child process, the real stage function on that project:

- `train`: `pipeline.training.cell_training.train_cell` for a TopK SAE (dict latents, k) with a budget of --steps optimiser steps of --batch
  rows (train.max_steps; the schedule spans those steps), its training split resident or streamed as
  `train.feed_memory` = --train-memory allows (`pipeline.training.feed`; the line says which, `feed`): beyond the
  budget the stage streams and its peak RSS stays flat in n;
- `evaluate`: `stages.evaluate` for that cell: both models encoded on the test split (10% of n), the matching rows
  (at most --eval-rows of the training split) and the pairs, every concept metric and the explanations;
- `train_step_streamed` / `train_step_in_memory`: in one process, side by side, the same --steps steps of the same
  SAE fed by the streaming reader (`pipeline.training.feed.streaming_batches`) and from the training split resident
  in memory (`load_rows`, batches gathered there), the loop alone (no initialisation, validation or checkpoints),
  so their ratio is the cost of streaming;
- `fbmp`: FBMP (beta 0.5, k 3) on the evaluation's sparse codes of the matching rows (read back from its code set)
  against the 308 labels.

Output: one JSON line per size and stage on stdout, keys n, stage, seconds, rows_per_s, peak_rss_mb (the peak
resident set of the stage's own child process, from os.wait4's rusage, not an estimate), plus `rows` (what
rows_per_s counts: optimiser rows for training, rows encoded by both models for evaluation, matching rows for
FBMP). A summary of the issue's goals goes to stderr: evaluate's peak RSS at the largest n within 1.2x of the
smallest and under 3 GB; evaluation time linear in rows; FBMP under 5 s; streamed steps at least 0.9x in-memory;
the train stage's peak RSS flat (within 1.2x) across the sizes it streamed. --stages runs a subset (the data,
encoder, extract, captions and probes stages always run).
Threads: whatever torch and BLAS get from the environment (OMP_NUM_THREADS=2 for "2 cores").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

#: the synthetic source's concept families (CUB-like: 28 families x 11 values = 308 attributes)
FAMILIES, VALUES = 28, 11


def params(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """params.yaml of one size: the synthetic source, one TopK cell, a step budget, the matching-row bound."""
    return {
        "seed": 0,
        "data": {"source": "synthetic", "n": n, "d": args.d, "families": FAMILIES, "values": VALUES, "noise": 0.05,
                 "n_pairs": min(1000, n // 20), "split": [0.8, 0.1, 0.1]},
        "train": {"batch_size": args.batch, "epochs": 1, "max_steps": args.steps, "lr": 5e-4, "patience": 1, "feed_memory": args.train_memory,
                  "shuffle_rows": args.shuffle_rows},
        "sweep": {"rotation": {"methods": ["identity"], "ks": [min(args.k, args.d)]},
                  "sae": {"methods": ["topk"], "dict_sizes": [args.dict], "ks": [args.k]}},
        "methods": {"identity": {}, "topk": {}},
        "evaluate": {"max_match_rows": args.eval_rows, "batch_size": 4096, "ks": [args.k]},
        "captions": {"width": 32, "layers": 1, "heads": 2, "max_pairs": 2000, "train": {"epochs": 1, "batch_size": 256}},
        "explain": {"caption_images": 100, "max_rows": 500},
        "report": {"title": "bench_scale"},
    }


# --- children: one measured stage per process ----------------------------------------------------------------------


def child(stage: str, root: Path) -> dict[str, Any]:
    """Run one stage in this process; returns {seconds, rows} (the parent measures memory)."""

    from pipeline.config import load_params
    from pipeline.paths import Layout

    p = load_params(root / "params.yaml")
    layout = Layout(root)
    cell = p.cells()[-1]
    settings = p.train_settings(cell.method)
    start = time.perf_counter()
    if stage in ("data", "encoder", "extract", "captions", "probes"):
        __import__(f"stages.{stage}", fromlist=["run"]).run(p, layout)
        return {"seconds": time.perf_counter() - start, "rows": p.data.n}
    if stage == "train":
        from pipeline.training.cell_training import train_cell

        train_cell(p, layout, cell)
        timings = json.loads(layout.model_timings(cell.name).read_text())
        return {"seconds": time.perf_counter() - start, "rows": args_steps(p) * settings.batch_size, "feed": timings["feed"],
                "read_s": timings["seconds"]["read"], "steps_s": timings["seconds"]["steps"]}
    if stage == "evaluate":
        import pipeline.scoring.cell_evaluation as scoring_cell
        from pipeline.scoring.codes import open_codes
        from stages import evaluate

        phases = {"encode": 0.0, "concepts": 0.0, "explain": 0.0}
        for name, function in (("encode", "encode_model"), ("concepts", "concept_metrics"), ("explain", "explain_run")):
            setattr(scoring_cell, function, timed(getattr(scoring_cell, function), phases, name))
        metrics = evaluate.run(p, layout, cell)
        encoded = sum(len(open_codes(layout.codes(cell.name) / model / part)) for model in ("trained", "untrained")
                      for part in ("test", "match", "pairs_before", "pairs_after"))
        return {"seconds": time.perf_counter() - start, "rows": encoded, "n_test": metrics["n_test"],
                **{f"{name}_s": round(value, 2) for name, value in phases.items()}}
    if stage == "steps":
        return side_by_side(p, layout, cell, settings)
    if stage == "fbmp":
        from pipeline.data.dataset import open_dataset
        from pipeline.metrics.matching import binarise, fbmp
        from pipeline.scoring.codes import open_codes

        codes = open_codes(layout.codes(cell.name) / "trained" / "match")
        active = binarise(codes.read())
        labels = open_dataset(layout.data).labels(codes.rows)
        start = time.perf_counter()
        fbmp(active, labels, beta=0.5, k=3)
        return {"seconds": time.perf_counter() - start, "rows": len(codes), "latents": codes.n_latents, "attributes": int(labels.shape[1]),
                "nnz_per_row": active.nnz / len(codes)}
    raise ValueError(f"unknown stage {stage!r}")


def timed(function: Any, phases: dict[str, float], name: str) -> Any:
    """`function`, adding its wall time to phases[name] (the evaluate child's breakdown: encoding passes, concept
    metrics, explanations)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            phases[name] += time.perf_counter() - start

    return wrapper


def args_steps(p: Any) -> int:
    return int(p.train.max_steps)


def side_by_side(p: Any, layout: Any, cell: Any, settings: Any) -> dict[str, Any]:
    """The same steps of the same SAE from the streaming reader, then from the training rows resident in memory."""
    import dataclasses

    import torch

    from pipeline.data.dataset import open_dataset, sample_rows
    from pipeline.models.registry import build
    from pipeline.store import open_store
    from pipeline.training.feed import load_rows, plan_feed, streaming_batches
    from pipeline.training.loop import array_batches, fit, make_optimizer

    data = open_dataset(layout.data)
    store = open_store(layout.image_embeddings)
    rows = data.rows("train")
    steps = args_steps(p)
    settings = dataclasses.replace(settings, epochs=1, feed="streaming", feed_memory="64GiB")
    device = torch.device("cpu")
    window = plan_feed(settings, len(rows), store.shape[1] * 4, store.chunk_rows, device).window_chunks
    init = torch.as_tensor(store.take(sample_rows(rows, 4096, p.seed)))
    in_memory = load_rows(store, {"train": rows[: steps * settings.batch_size]}, device)["train"]
    make_optimizer(build(cell.method, store.shape[1], cell.size, cell.k), 1e-3, 0.0)  # warm-up: the first optimiser imports torch's compiler
    times = {}
    for name, batches in (("streamed", streaming_batches(store, rows, settings.batch_size, p.seed, window, device)),
                          ("in_memory", array_batches(in_memory, settings.batch_size, p.seed))):
        model = build(cell.method, store.shape[1], cell.size, cell.k, seed=p.seed)
        model.fit_init(init)
        start = time.perf_counter()
        fit(model, batches, steps, settings, p.seed, name=name)
        times[name] = time.perf_counter() - start
    return {"seconds": times["streamed"], "in_memory_seconds": times["in_memory"], "rows": steps * settings.batch_size}


# --- the parent ----------------------------------------------------------------------------------------------------


def measure(stage: str, root: Path) -> dict[str, Any]:
    """Run `stage` in a child process; its result plus its own peak RSS (os.wait4's ru_maxrss, KiB on Linux)."""
    out = root / f"{stage}.result.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, __file__, "--child", stage, "--workdir", str(root), "--result", str(out)], env=env)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"bench_scale: stage {stage} at {root} failed (exit {process.returncode})")
    return {**json.loads(out.read_text()), "peak_rss_mb": usage.ru_maxrss / 1024}


def line(n: int, stage: str, seconds: float, rows: int, peak_rss_mb: float, **extra: Any) -> dict[str, Any]:
    record = {"n": n, "stage": stage, "seconds": round(seconds, 3), "rows_per_s": round(rows / seconds, 1), "peak_rss_mb": round(peak_rss_mb, 1),
              "rows": rows, **extra}
    print(json.dumps(record), flush=True)
    return record


def run_size(n: int, args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    root = workdir / f"n{n}"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    (root / "params.yaml").write_text(yaml.safe_dump(params(n, args), sort_keys=False))
    records = []
    for stage in ("data", "encoder", "extract", "captions", "probes"):
        result = measure(stage, root)
        if stage == "data":
            records.append(line(n, "data", result["seconds"], result["rows"], result["peak_rss_mb"]))
    for stage in [s for s in ("train", "evaluate") if s in args.stages]:
        result = measure(stage, root)
        keys = ("n_test", "encode_s", "concepts_s", "explain_s") if stage == "evaluate" else ("feed", "read_s", "steps_s")
        records.append(line(n, stage, result["seconds"], result["rows"], result["peak_rss_mb"], **{key: result[key] for key in keys}))
    if "steps" in args.stages:
        steps = measure("steps", root)
        records.append(line(n, "train_step_streamed", steps["seconds"], steps["rows"], steps["peak_rss_mb"]))
        records.append(line(n, "train_step_in_memory", steps["in_memory_seconds"], steps["rows"], steps["peak_rss_mb"]))
    if "fbmp" in args.stages and "evaluate" in args.stages:
        fb = measure("fbmp", root)
        records.append(line(n, "fbmp", fb["seconds"], fb["rows"], fb["peak_rss_mb"], latents=fb["latents"], attributes=fb["attributes"],
                            nnz_per_row=round(fb["nnz_per_row"], 2)))
    if not args.keep:
        shutil.rmtree(root)
    return records


def goals(records: list[dict[str, Any]]) -> list[str]:
    """The issue's goals, checked on what was measured."""
    by = {(r["n"], r["stage"]): r for r in records}
    sizes = sorted({r["n"] for r in records})
    small, large = sizes[0], sizes[-1]
    out = []
    if (small, "evaluate") in by:
        rss_small, rss_large = by[(small, "evaluate")]["peak_rss_mb"], by[(large, "evaluate")]["peak_rss_mb"]
        speeds = [by[(n, "evaluate")]["rows_per_s"] for n in sizes]
        encoding = [by[(n, "evaluate")]["rows"] / by[(n, "evaluate")]["encode_s"] for n in sizes]
        out += [
            f"evaluate peak RSS at n={large}: {rss_large:.0f} MB = {rss_large / rss_small:.2f}x that at n={small} ({rss_small:.0f} MB) "
            f"[goal: <= 1.2x and < 3000 MB: {'met' if rss_large <= 1.2 * rss_small and rss_large < 3000 else 'NOT met'}]",
            f"evaluation rows/s across sizes, whole stage: {', '.join(f'{s:.0f}' for s in speeds)}; encoding passes alone: "
            f"{', '.join(f'{s:.0f}' for s in encoding)} (max/min {max(encoding) / min(encoding):.2f}) [goal: time linear in rows, i.e. "
            "rows/s constant; the concept metrics add a cost bounded by the subset sizes (FMS: fms_max_n rows per concept)]",
        ]
    streamed = [n for n in sizes if by.get((n, "train"), {}).get("feed") == "streaming"]
    if len(streamed) >= 2:
        rss = [by[(n, "train")]["peak_rss_mb"] for n in streamed]
        out.append(f"train peak RSS where the split exceeds train.feed_memory (streaming, n = {', '.join(map(str, streamed))}): "
                   f"{', '.join(f'{r:.0f}' for r in rss)} MB, max/min {max(rss) / min(rss):.2f} [goal: flat, <= 1.2x: "
                   f"{'met' if max(rss) <= 1.2 * min(rss) else 'NOT met'}]")
    for n in sizes:
        parts = []
        if (n, "fbmp") in by:
            fb = by[(n, "fbmp")]
            parts.append(f"FBMP on {fb['rows']} x {fb['latents']} sparse codes x {fb['attributes']} attributes: {fb['seconds']:.2f} s "
                         f"[goal < 5 s: {'met' if fb['seconds'] < 5 else 'NOT met'}]")
        if (n, "train_step_streamed") in by:
            ratio = by[(n, "train_step_streamed")]["rows_per_s"] / by[(n, "train_step_in_memory")]["rows_per_s"]
            parts.append(f"streamed steps at {ratio:.2f}x in-memory [goal >= 0.9: {'met' if ratio >= 0.9 else 'NOT met'}]")
        if parts:
            out.append(f"n={n}: " + "; ".join(parts))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000,400000,1280000", help="numbers of embeddings, comma-separated")
    parser.add_argument("--d", type=int, default=768, help="embedding dimension")
    parser.add_argument("--dict", type=int, default=16384, help="SAE dictionary size (latents)")
    parser.add_argument("--k", type=int, default=32, help="active latents per row")
    parser.add_argument("--eval-rows", type=int, default=120_000, help="matching rows the coalitions are fitted on (evaluate.max_match_rows)")
    parser.add_argument("--steps", type=int, default=200, help="optimiser steps of the training stage")
    parser.add_argument("--batch", type=int, default=256, help="rows per optimiser step")
    parser.add_argument("--train-memory", default=0.5, type=lambda v: v if any(c.isalpha() for c in v) else float(v),
                        help="train.feed_memory: a fraction of free memory or a size such as 512MiB")
    parser.add_argument("--shuffle-rows", type=int, default=131_072, help="train.shuffle_rows: the streaming shuffle window")
    parser.add_argument("--stages", default="train,evaluate,steps,fbmp", type=lambda v: set(v.split(",")),
                        help="measured stages to run, comma-separated (fbmp needs evaluate)")
    parser.add_argument("--workdir", type=Path, default=None, help="where the scratch projects go (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep each size's scratch project")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import logging

        logging.basicConfig(level=logging.WARNING)
        args.result.write_text(json.dumps(child(args.child, args.workdir)))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    if any(n < 1000 for n in sizes) or args.k > args.dict:
        raise SystemExit("bench_scale: --sizes must be >= 1000 each and --k <= --dict")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench_scale-"))
    records = [r for n in sizes for r in run_size(n, args, workdir)]
    for text in goals(records):
        print(text, file=sys.stderr)


if __name__ == "__main__":
    main()
