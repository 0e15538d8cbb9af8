"""Pretrained encoders by name (`PretrainedSettings` -> `load_encoder`), and `open_encoder`, which reopens whatever
encoder the encoder stage left behind (a pretrained spec or the embedded model).

Settings (params.yaml `encoder:` for a pretrained model; `device` is "auto" by default everywhere):
    {kind: open_clip, arch: ViT-B-32, weights: laion2b_s34b_b79k}   weights: a tag, a local file, or omitted (random
                                                                     init); optional arch_config: a JSON config file
    {kind: hf_clip, model: openai/clip-vit-base-patch32}             a hub id or a local folder
    {kind: dinov2, model: facebook/dinov2-small}
    {kind: blip, model: Salesforce/blip-image-captioning-base}
Keys that do not belong to the kind are refused when the settings are built, before any model is loaded.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from pipeline.encoders import hf
from pipeline.encoders.base import Encoder
from pipeline.encoders.embedded import load_embedded
from pipeline.encoders.openclip import OpenClipEncoder, cached_tag_file, is_checkpoint_path
from pipeline.encoders.options import PretrainedSettings

SPEC_FILE = "spec.json"

def load_encoder(spec: PretrainedSettings) -> Encoder:
    """Build the pretrained encoder `spec` names (open_clip and transformers are imported only for its kind)."""
    if spec.kind == "open_clip":
        return OpenClipEncoder(spec.arch, spec.weights, device=spec.device, model_config=spec.arch_config)  # type: ignore[arg-type]
    cls = {"hf_clip": hf.HFClipEncoder, "dinov2": hf.Dinov2Encoder, "blip": hf.BlipEncoder}[spec.kind]
    return cls(spec.model, device=spec.device)  # type: ignore[arg-type]


#: what the loaders call the weights of each transformers kind in their messages
_HF_WHAT = {"hf_clip": "CLIP model", "dinov2": "DINOv2 model", "blip": "BLIP model"}


def unavailable_offline(spec: PretrainedSettings) -> str | None:
    """One line (key, value, and the instructions the encoder stage would give) when `spec`'s weights cannot be
    loaded without a network while offline, else None. A local path must exist; a hub id or open_clip tag must be
    in the local cache. Looks at files and the cache only: nothing is downloaded or built."""
    if spec.kind != "open_clip":
        try:
            if hf.local_folder(spec.model) is not None or not hf.hub_offline():  # type: ignore[arg-type]
                return None
        except FileNotFoundError as e:
            return f"encoder.model: {e}"
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(repo_id=str(spec.model), filename="config.json"), str):
            return None
        return f"encoder.model: {spec.model!r}: {hf.offline_help(str(spec.model), _HF_WHAT[spec.kind])}"
    if spec.weights is None:
        return None
    if is_checkpoint_path(spec.weights):
        return None if Path(spec.weights).expanduser().is_file() else f"encoder.weights: {spec.weights}: no such checkpoint file"
    if not hf.hub_offline():
        return None
    import open_clip  # only offline, to find where the tag's file would be cached (importing it takes seconds)

    tag = open_clip.get_pretrained_cfg(str(spec.arch), spec.weights)
    if not tag:
        return f"encoder.weights: {spec.weights!r} is not a pretrained tag of {spec.arch} (known: {', '.join(open_clip.list_pretrained_tags_by_model(str(spec.arch))) or 'none'})"
    if cached_tag_file(tag) is not None:
        return None
    return f"encoder.weights: {spec.weights!r}: {hf.offline_help(f'{spec.arch}:{spec.weights}', 'open_clip weights')}"


def save_spec(spec: PretrainedSettings, directory: Path, encoder: Encoder) -> None:
    """Record a pretrained encoder's settings in the encoder stage's output folder (the weights stay where they are)."""
    directory.mkdir(parents=True, exist_ok=True)
    record = {"spec": dataclasses.asdict(spec), "id": encoder.id, "dim": encoder.dim, "has_text": encoder.has_text}
    (directory / SPEC_FILE).write_text(json.dumps(record, indent=1))


def open_encoder(directory: Path, device: str | None = None) -> Encoder:
    """The encoder the encoder stage left in `directory`: a pretrained spec (spec.json) or the embedded model.

    device: where to run it; None = the device its settings name ("auto" for the embedded model).
    """
    spec_file = Path(directory) / SPEC_FILE
    if spec_file.is_file():
        spec = PretrainedSettings(**json.loads(spec_file.read_text())["spec"])
        return load_encoder(spec if device is None else dataclasses.replace(spec, device=device))
    return load_embedded(Path(directory), device=device or "auto")
