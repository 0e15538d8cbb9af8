"""Benchmark: the caption work the pipeline adds (captions stage, and explanations inside every evaluate stage).

    python bench/bench_captions.py [--objects 3000] [--multi 1500] [--d 64] [--epochs 1] [--seed 0]

On the default preset's sizes, with synthetic embeddings (each scene's attributes through a random linear
map plus noise, unit rows: learnable, so the captions are not noise) and the real scene captions:
(1) the decoder's training time for `--epochs` epochs at the default DecoderSettings, and the estimate for
the default's 8 epochs; (2) greedy decoding of the test images with cached keys/values (what
`decode_captions` does) against re-running the whole sequence each step (the straightforward loop), the
ratio, and whether both give identical captions; (3) `explain_run` per run on the test images (300 + 150)
for a rotation model (k = 16, with the default caption_ks) and a TopK SAE (512 latents, k = 16).
Thread count is whatever torch gets from the environment (e.g. OMP_NUM_THREADS=2 for "2 cores").
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root: tests/ holds the reference decoder

from pipeline.data.world.scenes import generate_multi, generate_objects
from pipeline.data.world.texts import attribute_phrases
from pipeline.explain.decoder import decode_captions, train_decoder
from pipeline.explain.explanations import Concepts, KindData, explain_run
from pipeline.explain.options import DecoderSettings, ExplainSettings
from pipeline.models.registry import build
from tests.test_explain_captions import greedy_by_full_forward  # the uncached reference decoder


def embed(attributes: np.ndarray, d: int, rng: np.random.Generator) -> np.ndarray:
    """Unit rows of attributes @ P + noise: (n, d) float32 embeddings that carry the labels linearly."""
    x = attributes.astype(np.float64) @ rng.standard_normal((attributes.shape[1], d)) + 0.5 * rng.standard_normal((len(attributes), d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=3000)
    parser.add_argument("--multi", type=int, default=1500)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1, help="decoder epochs to time (the default preset trains 8)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"torch threads: {torch.get_num_threads()}")

    start = time.perf_counter()
    objects = generate_objects(args.objects, image_size=32, seed=args.seed)
    multi = generate_multi(args.multi, image_size=32, seed=args.seed)
    print(f"scenes: {args.objects} objects + {args.multi} multi rendered in {time.perf_counter() - start:.1f} s (captions only are used)")
    a_obj, a_multi = objects.attributes.shape[1], multi.attributes.shape[1]
    labels = np.zeros((args.objects + args.multi, a_obj + a_multi), dtype=bool)
    labels[: args.objects, :a_obj], labels[args.objects:, a_obj:] = objects.attributes, multi.attributes
    x = embed(labels, args.d, rng)
    captions = list(objects.captions) + list(multi.captions)
    split = np.concatenate([objects.split, multi.split])
    train = np.flatnonzero(split == 0)

    settings = DecoderSettings(device="cpu")
    settings = dataclasses.replace(settings, train=dataclasses.replace(settings.train, epochs=args.epochs))
    start = time.perf_counter()
    decoder, history = train_decoder(x[train], [captions[i] for i in train], settings, seed=args.seed)
    seconds = time.perf_counter() - start
    print(f"(1) decoder training: {len(train)} pairs, {args.epochs} epoch(s) in {seconds:.1f} s "
          f"({seconds / args.epochs:.1f} s/epoch; the default's 8 epochs: about {8 * seconds / args.epochs:.0f} s); "
          f"final loss {history[-1]['train_loss']:.3f}")

    test_obj = np.flatnonzero(objects.split == 2)[:300]
    test_multi = np.flatnonzero(multi.split == 2)[:150] + args.objects
    test = np.concatenate([test_obj, test_multi])
    start = time.perf_counter()
    cached = decode_captions(decoder, x[test])
    t_cached = time.perf_counter() - start
    start = time.perf_counter()
    full = greedy_by_full_forward(decoder, x[test], 24)
    t_full = time.perf_counter() - start
    same = sum(a == b for a, b in zip(cached, full))
    print(f"(2) greedy captions of {len(test)} images: cached {t_cached:.2f} s, full re-run {t_full:.2f} s, "
          f"speed-up x{t_full / t_cached:.1f}; identical captions {same}/{len(test)}")

    words = sorted({w for c in captions for w in c.replace(",", " ").split()})[:300]
    concepts = Concepts(texts=words, embeddings=rng.standard_normal((len(words), args.d)).astype(np.float32))
    image_mean = x[train].mean(axis=0)
    kinds = []
    for kind, rows, columns, truth in (("objects", test_obj, slice(0, a_obj), objects), ("multi", test_multi, slice(a_obj, None), multi)):
        names = list(truth.attribute_names)
        kinds.append(KindData(kind=kind, rows=rows, x=x[rows], attributes=labels[rows][:, columns], attribute_names=names,
                              families=dict(truth.families), phrases=attribute_phrases(names), truth=[captions[i] for i in rows], scored=kind == "objects",
                              pair_ids=np.arange(4), pairs_before=x[rows[:4]], pairs_after=x[rows[4:8]], pair_edits=["edit"] * 4))
    settings = ExplainSettings(caption_ks=(2, 4, 8, 16, 32, 64))
    rotation = build("random_rotation", args.d, args.d, 16, seed=args.seed)
    rotation.fit_init(torch.as_tensor(x[train]))
    sae = build("topk", args.d, 512, 16, seed=args.seed)
    sae.fit_init(torch.as_tensor(x[train]))
    timings = {}
    for name, model in (("rotation k=16 (7 caption ks)", rotation), ("topk SAE 512 latents k=16", sae)):
        start = time.perf_counter()
        result = explain_run(model.eval(), 16, decoder, kinds, concepts, image_mean, settings)
        timings[name] = time.perf_counter() - start
        rates = {kind: round(r["sparse"], 3) for kind, r in result["describes"].items()}
        print(f"(3) explain_run, {name}: {timings[name]:.2f} s; sparse 'describes' rates {rates}")
    (a, ta), (b, tb) = timings.items()
    print(f"    ratio {a} / {b}: {ta / tb:.2f}")


if __name__ == "__main__":
    main()
