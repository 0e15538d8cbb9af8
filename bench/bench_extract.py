"""Extraction throughput: the pipeline's two image paths next to a bare forward loop, in one run.

    OMP_NUM_THREADS=1 python bench/bench_extract.py [--n 500] [--workers 1] [--batch 50]
    OMP_NUM_THREADS=1 python bench/bench_extract.py --arch ViT-B-32 --size 320 --n 400 --batch 32

A randomly initialised open_clip model embeds `--n` generated PNGs (resized and centre-cropped by
open_clip's transform) two ways. `--arch tiny` (default) is a small ViT (64 px input, width 128,
4 layers) whose forward pass costs about as much as decoding a 96 px PNG: the data path's worst case.
Any open_clip architecture name (e.g. ViT-B-32, the model the issue names; no weights needed, the
speed of a forward pass does not depend on them) measures the regime users run, where the forward
pass dominates and decoding hides behind it.

- bare loop: every image decoded and preprocessed beforehand, then only `encode_images` on the
  in-memory float tensors, batch by batch: the model's own speed;
- extract stage: `stages.extract.embed_store` from a uint8 zarr store (the dataset's images.zarr,
  written by the data stage) into a float32 embeddings store: zarr reads, the encoder's preprocessing,
  the forward pass and zarr writes, exactly what the extract stage runs per store;
- DataLoader path: `iter_image_batches` (PIL decoding of the files + preprocessing in spawned workers)
  feeding `encode_images`: how image files are decoded in parallel (the data stage of real datasets).

Prints images/s of each and their ratio to the bare loop (target >= 0.9); for the DataLoader path both
for the whole run (including the
start-up and shut-down of the spawned workers: fixed costs of seconds, mostly importing torch and
open_clip in the worker, and its exit) and for the steady state (first to last batch), the share of the steady state the main process
spent waiting for data, then the peak RSS of this process and of the workers (getrusage). On a machine
whose cores are busy with other work, the workers' decoding competes with the forward pass for CPU:
the waiting share then tells the data path's own cost apart from that contention.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from pipeline.data.images import SquareUint8, iter_image_batches, open_rgb
from pipeline.encoders.openclip import OpenClipEncoder
from pipeline.store import open_store, write_array
from stages.extract import embed_store

ARCH = "bench-tiny-vit"
CONFIG = {
    "embed_dim": 64,
    "vision_cfg": {"image_size": 64, "layers": 4, "width": 128, "head_width": 32, "patch_size": 8},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 1},
}


def write_pngs(folder: Path, n: int, size: int, seed: int = 0) -> list[Path]:
    """n PNGs (size x size RGB): smooth colour gradients plus noise, so they compress like photos, not like flat fills."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 1, size, dtype=np.float32)
    paths = []
    for i in range(n):
        a, b, c = rng.uniform(0, 255, 3)
        channels = [a * ramp[None, :], b * ramp[:, None], np.full((1, 1), c)]  # horizontal, vertical, flat
        image = np.stack([np.broadcast_to(x, (size, size)) for x in channels], axis=-1)
        image = np.clip(image + rng.normal(0, 12, image.shape), 0, 255).astype(np.uint8)
        path = folder / f"{i:05d}.png"
        Image.fromarray(image).save(path)
        paths.append(path)
    return paths


def build_encoder(arch: str, folder: Path) -> OpenClipEncoder:
    """The benchmarked model, randomly initialised: the tiny config above or a named open_clip architecture."""
    torch.manual_seed(0)
    if arch != "tiny":
        return OpenClipEncoder(arch, None, device="cpu")
    config = folder / f"{ARCH}.json"
    config.write_text(json.dumps(CONFIG))
    return OpenClipEncoder(ARCH, None, device="cpu", model_config=config)


def time_store(encoder: OpenClipEncoder, images: Path, out: Path, batch: int) -> tuple[float, np.ndarray]:
    """One pass of the extract stage's path (uint8 store -> embeddings store): images/s and the embeddings."""
    if out.exists():
        shutil.rmtree(out)
    source = open_store(images)
    start = time.perf_counter()
    embed_store(encoder, source, out, batch, batch * 4, {"bench": True}, {}, "store")
    rate = len(source) / (time.perf_counter() - start)
    return rate, open_store(out).read()


def time_loader(encoder: OpenClipEncoder, paths: list[Path], args: argparse.Namespace) -> dict:
    """One pass of the DataLoader path: rates, start-up, time blocked on data after the first batch, embeddings."""
    start = time.perf_counter()
    first = ready = None
    wait, rows_after_first, out = 0.0, 0, []
    for batch in iter_image_batches(paths, encoder.preprocess, args.batch, args.workers):
        now = time.perf_counter()
        if first is None:
            first = now
        else:
            wait += now - ready
            rows_after_first += len(batch.indices)
        out.append(encoder.encode_images(batch.pixels, batch_size=args.batch))
        ready = time.perf_counter()
    end = time.perf_counter()  # after the workers were shut down (the DataLoader joins them at exhaustion)
    return dict(total_rate=len(paths) / (end - start), steady_rate=rows_after_first / (ready - first), startup_s=first - start,
                shutdown_s=end - ready, wait_s=wait, steady_s=ready - first, embeddings=np.concatenate(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="tiny", help="'tiny' or an open_clip architecture name (random weights)")
    parser.add_argument("--n", type=int, default=500, help="number of generated PNGs")
    parser.add_argument("--size", type=int, default=96, help="PNG side in pixels")
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers (spawned)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the main process")
    parser.add_argument("--rounds", type=int, default=3, help="alternating repetitions; medians are printed")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        encoder = build_encoder(args.arch, folder)
        paths = write_pngs(folder, args.n, args.size)

        pixels = torch.stack([encoder.preprocess(open_rgb(p)) for p in paths])  # (n, 3, h, w), outside the timing
        square = SquareUint8(args.size)  # the uint8 images.zarr the data stage writes (here at the PNGs' own size)
        write_array(folder / "images.zarr", np.stack([square(open_rgb(p)).numpy() for p in paths]), fingerprint={"bench": True})
        encoder.encode_images(pixels[: args.batch], batch_size=args.batch)  # warm-up
        bare_rates, store_rates, loader = [], [], []
        for _ in range(args.rounds):  # alternate the paths, so a busy neighbour slows all alike
            start = time.perf_counter()
            bare = [encoder.encode_images(pixels[i : i + args.batch], batch_size=args.batch) for i in range(0, args.n, args.batch)]
            bare_rates.append(args.n / (time.perf_counter() - start))
            rate, stored = time_store(encoder, folder / "images.zarr", folder / "embeddings.zarr", args.batch)
            store_rates.append(rate)
            loader.append(time_loader(encoder, paths, args))
            assert np.allclose(np.concatenate(bare), loader[-1].pop("embeddings"), atol=1e-5), "the two paths disagree"
            assert np.allclose(np.concatenate(bare), stored, atol=1e-5), "the store path disagrees"

    rss_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rss_children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"open_clip {ARCH if args.arch == 'tiny' else args.arch}: d={encoder.dim}, input {encoder.input_size}; {args.n} PNGs of {args.size} px; "
          f"batch {args.batch}, {args.workers} spawned worker(s), {args.threads} torch thread(s)")
    bare_rate = float(np.median(bare_rates))
    median = {key: float(np.median([run[key] for run in loader])) for key in loader[0]}
    print(f"medians of {args.rounds} alternating rounds")
    print(f"{'what':<40}{'images/s':>10}{'ratio':>8}")
    print(f"{'bare forward loop (preprocessed tensors)':<40}{bare_rate:>10.1f}{1.0:>8.2f}")
    store_rate = float(np.median(store_rates))
    print(f"{'extract stage (uint8 store -> store)':<40}{store_rate:>10.1f}{store_rate / bare_rate:>8.2f}")
    print(f"{'DataLoader path, whole run':<40}{median['total_rate']:>10.1f}{median['total_rate'] / bare_rate:>8.2f}")
    print(f"{'DataLoader path, steady state':<40}{median['steady_rate']:>10.1f}{median['steady_rate'] / bare_rate:>8.2f}")
    print(f"fixed costs: worker start-up (time to first batch) {median['startup_s']:.2f} s, worker shut-down {median['shutdown_s']:.2f} s")
    fixed, steady = median["startup_s"] + median["shutdown_s"], median["steady_rate"]
    if steady > 0.9 * bare_rate:  # n / (fixed + n / steady) >= 0.9 bare  <=>  n >= 0.9 bare fixed / (1 - 0.9 bare / steady)
        print(f"the DataLoader path's whole run reaches 0.9 of the bare loop from about {0.9 * bare_rate * fixed / (1 - 0.9 * bare_rate / steady):.0f} images")
    else:
        print("the DataLoader path's steady state is below 0.9 of the bare loop: no run length reaches it")
    print(f"steady state: the main process waited for data {median['wait_s']:.3f} s of {median['steady_s']:.2f} s "
          f"({100 * median['wait_s'] / median['steady_s']:.1f}%)")
    print(f"peak RSS: main process {rss_self:.0f} MiB, largest worker {rss_children:.0f} MiB")


if __name__ == "__main__":
    main()
