"""`load_encoder(spec)`: one dict from params.yaml -> the matching `Encoder`.

Specs (keys beyond "kind"; `device` is optional everywhere, "auto" by default):
    {"kind": "open_clip", "arch": "ViT-B-32", "weights": "laion2b_s34b_b79k"}   weights: tag, file or null;
                                                                               optional "model_config": JSON file
    {"kind": "hf_clip", "model": "openai/clip-vit-base-patch32"}               hub id or local folder
    {"kind": "dinov2", "model": "facebook/dinov2-small"}
    {"kind": "blip", "model": "Salesforce/blip-image-captioning-base"}
    {"kind": "embedded", "path": "store/encoder"}                               `load_embedded`'s folder
Missing or unknown keys and unknown kinds raise one clear ValueError before any model is loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pipeline.encoders.base import Encoder

# kind -> (required keys, optional keys)
SPEC_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "open_clip": (("arch",), ("weights", "model_config", "device")),
    "hf_clip": (("model",), ("device",)),
    "dinov2": (("model",), ("device",)),
    "blip": (("model",), ("device",)),
    "embedded": (("path",), ("device",)),
}


def _open_clip(spec: Mapping[str, Any]) -> Encoder:
    from pipeline.encoders.openclip import OpenClipEncoder

    return OpenClipEncoder(spec["arch"], spec.get("weights"), device=spec.get("device", "auto"), model_config=spec.get("model_config"))


def _hf(cls_name: str) -> Callable[[Mapping[str, Any]], Encoder]:
    def build(spec: Mapping[str, Any]) -> Encoder:
        from pipeline.encoders import hf

        return getattr(hf, cls_name)(spec["model"], device=spec.get("device", "auto"))

    return build


def _embedded(spec: Mapping[str, Any]) -> Encoder:
    from pipeline.encoders.embedded import load_embedded

    return load_embedded(Path(spec["path"]), device=spec.get("device", "auto"))


BUILDERS: dict[str, Callable[[Mapping[str, Any]], Encoder]] = {
    "open_clip": _open_clip,
    "hf_clip": _hf("HFClipEncoder"),
    "dinov2": _hf("Dinov2Encoder"),
    "blip": _hf("BlipEncoder"),
    "embedded": _embedded,
}


def check_spec(spec: Mapping[str, Any]) -> str:
    """Validate an encoder spec's shape (kind, required and allowed keys); return its kind."""
    if not isinstance(spec, Mapping):
        raise TypeError(f"encoder spec: expected a mapping like {{'kind': 'open_clip', ...}}, got {type(spec).__name__}")
    kind = spec.get("kind")
    if kind not in SPEC_KEYS:
        raise ValueError(f"encoder spec: unknown kind {kind!r}; expected one of {', '.join(SPEC_KEYS)}")
    required, optional = SPEC_KEYS[kind]
    missing = [key for key in required if spec.get(key) in (None, "")]
    if missing:
        raise ValueError(f"encoder spec (kind {kind!r}): missing {', '.join(missing)}; expected keys {', '.join(required)} (optional: {', '.join(optional)})")
    unknown = sorted(set(spec) - {"kind", *required, *optional})
    if unknown:
        raise ValueError(f"encoder spec (kind {kind!r}): unknown keys {', '.join(unknown)}; allowed: {', '.join((*required, *optional))}")
    return kind


def load_encoder(spec: Mapping[str, Any]) -> Encoder:
    """Build the encoder a spec describes (see the module docstring); the heavy libraries are imported only for that kind."""
    return BUILDERS[check_spec(spec)](spec)


def save_spec(spec: Mapping[str, Any], directory: Path, encoder_id: str, dim: int, has_text: bool) -> None:
    """Record a pretrained encoder's spec in the encoder stage's output folder (the weights stay where they are)."""
    import json

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "spec.json").write_text(json.dumps({"spec": dict(spec), "id": encoder_id, "dim": dim, "has_text": has_text}, indent=1))


def open_encoder(directory: Path, device: str = "auto") -> Encoder:
    """The encoder the encoder stage left in `directory`: a pretrained spec (spec.json) or the embedded model."""
    import json

    spec_file = Path(directory) / "spec.json"
    if spec_file.is_file():
        return load_encoder(json.loads(spec_file.read_text())["spec"])
    from pipeline.encoders.embedded import load_embedded

    return load_embedded(Path(directory), device=device)
