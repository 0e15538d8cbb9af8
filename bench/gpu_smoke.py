"""GPU smoke benchmark: extraction, one SAE cell and one CEDAR cell, each against the bare loop, in one run.

    python bench/gpu_smoke.py [--n 200000] [--d 768] [--dict 16384] [--k 32] [--steps 300] [--batch 4096]
                              [--images 4096] [--arch ViT-B-32] [--device auto] [--workdir DIR]

What a GPU node should finish in under 5 minutes at the defaults, printing one JSON line per phase with the
pipeline's throughput next to the bare loop's, measured in the same process on the same device:

- `extract`: `OpenClipEncoder.encode_images` (the extract stage's path: uint8 images copied to the device pinned and
  non-blocking, open_clip's preprocessing there as batched ops when `device_preprocess` mirrors it, else per image;
  bfloat16 autocast) on --images random images with randomly initialised --arch weights, against
  `model.encode_image` on the same images already preprocessed and on the device (the bare forward), both warm;
  `preprocess` says which path ran ("device" or "per image");
- `train_sae` / `train_cedar`: the train stage of a TopK SAE (--dict latents, k) and of CEDAR (d latents, k) on
  --n synthetic embeddings of dimension --d read from the zarr store (--steps steps of --batch rows; bf16
  autocast for the SAE, float32 for CEDAR; `pipeline.training.cell_training.train_cell` in this process, its imports
  done), against the warm bare step loop (the same model, batches already on the device, forward, backward, AdamW
  step; timed after 10 untimed steps). `feed` says which data mode the stage chose (resident or streaming,
  `pipeline.training.feed`) and `breakdown` its own seconds (store/models/<run>.timings.json: open, device start,
  read, init, steps, validation, checkpoint, save, ...), `steps_share` the share of its time in steps;
- `evaluate_sae` / `evaluate_cedar`: the evaluate stage of each cell (every metric and the explanations), rows
  encoded per second (no bare counterpart: reported for scale).

Keys: phase, device, seconds, per_s (pipeline), bare_per_s, ratio (pipeline / bare), unit; and feed, breakdown,
steps_share (training phases), preprocess (extraction). Goals (issue 21): ratio >= 0.8 for extract, train_sae and
train_cedar on an H200. On a CPU (no GPU here) it runs with reduced sizes to prove the script, e.g. `--n 20000 --d 64
--dict 1024 --k 8 --steps 30 --batch 256 --images 16`; its numbers then say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

from pipeline.config import load_params  # noqa: E402
from pipeline.paths import Layout  # noqa: E402
from pipeline.training.device import device_name, resolve_device  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def report(phase: str, device: torch.device, seconds: float, count: int, unit: str, bare_seconds: float | None = None, **extra: Any) -> None:
    record: dict[str, Any] = {"phase": phase, "device": device_name(device), "seconds": round(seconds, 3), "per_s": round(count / seconds, 1),
                              "unit": unit}
    if bare_seconds is not None:
        record.update(bare_per_s=round(count / bare_seconds, 1), ratio=round(bare_seconds / seconds, 3))
    print(json.dumps(record | extra), flush=True)


def extraction(args: argparse.Namespace, device: torch.device) -> None:
    from PIL import Image

    from pipeline.encoders.openclip import OpenClipEncoder

    encoder = OpenClipEncoder(args.arch, None, device=str(device))
    images = np.random.default_rng(0).integers(0, 256, (args.images, 224, 224, 3), dtype=np.uint8)
    encoder.encode_images(images[: args.batch_images], batch_size=args.batch_images)  # warm-up (kernels, autotuning)
    sync(device)
    start = time.perf_counter()
    encoder.encode_images(images, batch_size=args.batch_images)
    sync(device)
    pipeline_seconds = time.perf_counter() - start
    pixels = torch.stack([encoder.preprocess(Image.fromarray(image)) for image in images]).to(device)
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        encoder.model.encode_image(pixels[: args.batch_images])
        sync(device)
        start = time.perf_counter()
        for i in range(0, len(pixels), args.batch_images):
            encoder.model.encode_image(pixels[i : i + args.batch_images])
        sync(device)
    report("extract", device, pipeline_seconds, args.images, "images", time.perf_counter() - start,
           preprocess="device" if encoder.device_preprocess is not None else "per image")


def project(args: argparse.Namespace, device: torch.device, workdir: Path) -> Path:
    """A synthetic project with one TopK SAE cell and one CEDAR cell on `device`, data/encoder/extract/captions done."""
    from stages import captions, data, encoder, extract, probes

    root = workdir / "gpu_smoke"
    root.mkdir(parents=True, exist_ok=True)
    dev = str(device)
    params = {
        "seed": 0,
        "data": {"source": "synthetic", "n": args.n, "d": args.d, "families": 28, "values": 11, "n_pairs": min(1000, args.n // 20)},
        "train": {"batch_size": args.batch, "epochs": 1, "max_steps": args.steps, "lr": 5e-4, "device": dev, "precision": "bf16"},
        "sweep": {"rotation": {"methods": ["cedar"], "ks": [args.k]}, "sae": {"methods": ["topk"], "dict_sizes": [args.dict], "ks": [args.k]}},
        "methods": {"cedar": {"train": {"lr": 0.01}}, "topk": {}},
        "evaluate": {"ks": [args.k], "batch_size": 8192, "device": dev},
        "captions": {"width": 64, "layers": 1, "heads": 2, "max_pairs": 5000, "device": dev, "train": {"epochs": 1, "batch_size": 256}},
        "explain": {"caption_images": 100},
        "report": {"title": "gpu_smoke"},
    }
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    p, layout = load_params(root / "params.yaml"), Layout(root)
    for stage in (data, encoder, extract, captions, probes):
        stage.run(p, layout)
    return root


def bare_steps(model: torch.nn.Module, x: torch.Tensor, steps: int, batch: int, bf16: bool, device: torch.device, warmup: int = 10) -> float:
    """Seconds of `steps` plain AdamW steps of the model's training loss on batches already on the device, timed
    after `warmup` untimed steps (the warm loop: optimiser created, kernels chosen, caches filled)."""
    optimizer = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=5e-4)
    generator = torch.Generator(device=device).manual_seed(0)
    batches = [x[(i * batch) % len(x):][:batch] for i in range(warmup + steps)]
    start = 0.0
    for i, xb in enumerate(batches):
        if i == warmup:
            sync(device)
            start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss, _ = model.training_loss(xb, (i - warmup) / steps, generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        model.after_step()
    sync(device)
    return time.perf_counter() - start


def cells(args: argparse.Namespace, device: torch.device, root: Path) -> None:
    from pipeline.models.registry import build
    from pipeline.scoring.codes import open_codes
    from pipeline.store import open_store
    from pipeline.training.cell_training import train_cell
    from stages import evaluate

    p, layout = load_params(root / "params.yaml"), Layout(root)
    store = open_store(layout.image_embeddings)
    x = torch.as_tensor(store.read(0, min(len(store), args.steps * args.batch)), device=device)
    for cell in reversed(p.cells()):  # the SAE first, then CEDAR
        name = "sae" if not cell.rotation else "cedar"
        start = time.perf_counter()
        train_cell(p, layout, cell)
        sync(device)
        stage_seconds = time.perf_counter() - start
        model = build(cell.method, args.d, cell.size, cell.k, seed=0, **p.method_options(cell.method)).to(device)
        model.fit_init(x[:4096])
        bare = bare_steps(model, x, args.steps, args.batch, bf16=model.autocast_safe and device.type == "cuda", device=device)
        timings = json.loads(layout.model_timings(cell.name).read_text())
        report(f"train_{name}", device, stage_seconds, args.steps * args.batch, "rows (whole stage: read, init, steps, validation, checkpoint)", bare,
               feed=timings["feed"], breakdown=timings["seconds"], steps_share=timings["steps_share"])
        start = time.perf_counter()
        evaluate.run(p, layout, cell)
        encoded = sum(len(open_codes(layout.codes(cell.name) / model / part)) for model in ("trained", "untrained") for part in ("test", "match"))
        report(f"evaluate_{name}", device, time.perf_counter() - start, encoded, "rows encoded (test and matching rows, both models; every metric)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200_000, help="synthetic embeddings")
    parser.add_argument("--d", type=int, default=768, help="embedding dimension")
    parser.add_argument("--dict", type=int, default=16384, help="SAE latents")
    parser.add_argument("--k", type=int, default=32, help="active latents per row (SAE and CEDAR)")
    parser.add_argument("--steps", type=int, default=300, help="optimiser steps per training")
    parser.add_argument("--batch", type=int, default=4096, help="rows per step")
    parser.add_argument("--images", type=int, default=4096, help="images for the extraction phase")
    parser.add_argument("--batch-images", type=int, default=256, help="images per forward pass")
    parser.add_argument("--arch", default="ViT-B-32", help="open_clip architecture (random weights)")
    parser.add_argument("--device", default="auto", help="auto, cuda, cuda:1, cpu")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    device = resolve_device(args.device)
    if device.type != "cuda":
        print(f"gpu_smoke: running on {device_name(device)}: the numbers say nothing about a GPU", file=sys.stderr)
    start = time.perf_counter()
    extraction(args, device)
    root = project(args, device, args.workdir or Path(tempfile.mkdtemp(prefix="gpu_smoke-")))
    cells(args, device, root)
    print(f"gpu_smoke: {time.perf_counter() - start:.0f} s in all", file=sys.stderr)


if __name__ == "__main__":
    main()
