"""One image explained by one trained run: its top concepts and the captions of its sparse reconstruction and of its
dense embedding (what `cedar explain IMAGE` prints).

The image goes through the same path as the dataset's images (decoded and cropped to the dataset's image size,
`pipeline.data.images.load_image`), then through the encoder the encoder stage left (any kind, through
`pipeline.encoders.registry.open_encoder`), then through the run's model at k active latents. Each latent's name
is the vocabulary concept nearest to its direction (`pipeline.explain.naming`); the captions come from the
caption decoder the captions stage trained. Everything is read from the stages' outputs under `layout`; a missing
or unusable one fails with one line saying which and what to run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline.data.dataset import open_dataset
from pipeline.data.images import load_image
from pipeline.encoders.registry import open_encoder
from pipeline.explain.decoder import decode_captions, load_decoder
from pipeline.explain.explanations import latent_labels
from pipeline.explain.naming import dense_explanations, latent_directions, name_latents
from pipeline.models.checkpoint import load_model
from pipeline.paths import Layout
from pipeline.store import open_store


@dataclass(frozen=True)
class ActiveConcept:
    """One active latent of the image's code: its label (`+3` / `-3` for a rotation's half-axes, `17` for an SAE
    latent), its activation, and the concept its direction is nearest to with that cosine."""

    latent: str
    activation: float
    concept: str
    cosine: float


@dataclass(frozen=True)
class ImageExplanation:
    """What `explain_image` found. concepts / dense_concepts are None when the encoder has no text tower (then
    `no_concepts` says why); concepts is empty when no latent is active."""

    run: str
    k: int
    concepts: tuple[ActiveConcept, ...] | None
    dense_concepts: tuple[tuple[str, float], ...] | None
    no_concepts: str | None
    sparse_caption: str
    dense_caption: str


def explain_image(layout: Layout, run: str, image_path: Path, k: int | None, default_k: int, top: int = 5) -> ImageExplanation:
    """Explain the image at `image_path` with run `run`'s model (store/models/<run>) at k active latents (None: the
    run's own k, `default_k`), naming its `top` most active latents. Raises ValueError / FileNotFoundError with one
    line naming the culprit: an unreadable image, a dataset without images, an untrained run, k out of range, an
    encoder whose dimension is not the run's."""
    if top < 1:
        raise ValueError(f"--top: expected an int >= 1, got {top}")
    data = open_dataset(layout.data)
    if not data.has_images:
        raise ValueError(f"{layout.data}: the dataset has no images (its source wrote the embeddings; no encoder to embed {image_path})")
    image = load_image(image_path, int(data.meta["image_size"]))  # an unreadable file fails here, before any model loads
    model_dir = layout.model(run)
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir}: run {run} is not trained yet (run `dvc repro` first)")
    model = load_model(model_dir)
    k = default_k if k is None else k
    if not 1 <= k <= model.n_latents:
        raise ValueError(f"--k: expected 1..{model.n_latents} (the latents of {run}), got {k}")
    x = open_encoder(layout.encoder).encode_images(image[None])  # (1, d)
    if x.shape[1] != model.d:
        raise ValueError(f"{layout.encoder}: the encoder gives d = {x.shape[1]}, but run {run} was trained on d = {model.d}; rerun `dvc repro`")
    decoder = load_decoder(layout.captions)
    codes = model.latents(torch.as_tensor(model.encode(x, k)))[0].numpy()  # (latents,) non-negative half-axis activations
    concepts = dense_concepts = no_concepts = None
    if layout.concept_embeddings.exists():
        store = open_store(layout.concept_embeddings)
        texts, embeddings = [str(t) for t in store.attrs["texts"]], store.read()
        text_mean = embeddings.astype(np.float64).mean(axis=0)
        named = name_latents(latent_directions(model), embeddings, texts, top=1, text_mean=text_mean)
        labels = latent_labels(model.n_latents, model.signed)
        active = np.argsort(-codes, kind="stable")[: int((codes > 0).sum())][:top]
        concepts = tuple(ActiveConcept(labels[i], float(codes[i]), str(named.names[i, 0]), float(named.scores[i, 0])) for i in active)
        dense = dense_explanations(x, decoder.input_mean.cpu().numpy(), embeddings, texts, top=min(top, len(texts)), text_mean=text_mean)[0]
        dense_concepts = tuple((str(name), float(score)) for name, score in dense)
    else:
        no_concepts = f"{layout.concept_embeddings} missing: the encoder has no text tower"
    sparse = np.asarray(model.decode(model.encode(x, k)), dtype=np.float32)
    sparse_caption, dense_caption = decode_captions(decoder, np.concatenate([sparse, x.astype(np.float32)]))
    return ImageExplanation(run, k, concepts, dense_concepts, no_concepts, sparse_caption, dense_caption)
