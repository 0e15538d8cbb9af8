"""Tests for the real-model adapters (open_clip, transformers CLIP / DINOv2 / BLIP) and the registry.

No weights exist offline, so each adapter is tested with a tiny randomly initialised model (hidden 32,
2 layers, 32 px images) saved to a local file or folder and loaded back through the public path; the
embeddings are compared with a reference computed directly from the saved model.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import string
import time
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import save_file

from pipeline.encoders import hf as hf_module
from pipeline.encoders.base import Encoder
from pipeline.encoders.embedded import EmbeddedCLIP, save_embedded
from pipeline.encoders.hf import BlipEncoder, Dinov2Encoder, HFClipEncoder, hub_offline
from pipeline.encoders.openclip import OpenClipEncoder, cached_tag_file
from pipeline.encoders.options import EmbeddedSettings, PretrainedSettings
from pipeline.encoders.registry import load_encoder, open_encoder, save_spec

ARCH = "tiny-vit-test"
OPEN_CLIP_CONFIG = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}
TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
TEXTS = ["a red circle", "two small blue squares on grass", "a"]


def images(n: int = 4, size: int = 40, seed: int = 0) -> np.ndarray:
    """n random uint8 images (n, size, size, 3); not 32 px, so the resize/crop of each adapter is exercised."""
    return np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


def assert_unit_rows(out: np.ndarray, n: int, d: int) -> None:
    assert out.dtype == np.float32 and out.shape == (n, d)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=0, atol=1e-5)


def reference(features: torch.Tensor) -> np.ndarray:
    return F.normalize(features.float(), dim=-1).numpy()


# --- open_clip -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def open_clip_files(tmp_path_factory) -> dict[str, Path]:
    """A tiny open_clip ViT (config JSON registered as `tiny-vit-test`), its weights as .safetensors and .pt."""
    root = tmp_path_factory.mktemp("open_clip")
    config = root / f"{ARCH}.json"
    config.write_text(json.dumps(OPEN_CLIP_CONFIG))
    open_clip.add_model_config(config)
    torch.manual_seed(0)
    model = open_clip.create_model(ARCH)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(root / "tiny.safetensors"))
    torch.save(state, root / "tiny.pt")
    return {"config": config, "safetensors": root / "tiny.safetensors", "pt": root / "tiny.pt"}


@pytest.fixture(scope="module")
def open_clip_encoder(open_clip_files) -> OpenClipEncoder:
    return OpenClipEncoder(ARCH, open_clip_files["safetensors"], device="cpu", model_config=open_clip_files["config"])


def test_open_clip_from_safetensors_matches_the_saved_model(open_clip_encoder, open_clip_files):
    encoder = open_clip_encoder
    sha = hashlib.sha256(open_clip_files["safetensors"].read_bytes()).hexdigest()
    assert encoder.id == f"open_clip:{ARCH}:file-{sha[:12]}"
    assert (encoder.dim, encoder.has_text, encoder.input_size) == (16, True, (32, 32))
    assert isinstance(encoder, Encoder)
    x = images(5)
    out = encoder.encode_images(x, batch_size=2)
    assert_unit_rows(out, 5, 16)
    np.testing.assert_array_equal(out, encoder.encode_images(x, batch_size=2))  # deterministic
    np.testing.assert_allclose(out, encoder.encode_images(x, batch_size=5), atol=1e-6)  # batching changes float rounding only
    # reference: open_clip's own transform and encode_image on the same saved weights
    model = open_clip.create_model(ARCH, pretrained=str(open_clip_files["safetensors"])).eval()
    pixels = torch.stack([encoder.preprocess(Image.fromarray(im)) for im in x])
    with torch.no_grad():
        np.testing.assert_allclose(out, reference(model.encode_image(pixels)), atol=1e-6)
        tokens = open_clip.get_tokenizer(ARCH)(TEXTS)
        np.testing.assert_allclose(encoder.encode_texts(TEXTS), reference(model.encode_text(tokens)), atol=1e-6)
    # the DataLoader path (preprocessed float tensors) gives the same embeddings as the uint8 path
    np.testing.assert_allclose(encoder.encode_images(pixels), out, atol=1e-6)


def test_open_clip_pt_checkpoint_loads_the_same_weights(open_clip_encoder, open_clip_files):
    from_pt = OpenClipEncoder(ARCH, str(open_clip_files["pt"]), device="cpu")
    sha = hashlib.sha256(open_clip_files["pt"].read_bytes()).hexdigest()
    assert from_pt.id == f"open_clip:{ARCH}:file-{sha[:12]}"
    x = images(3, seed=1)
    np.testing.assert_array_equal(from_pt.encode_images(x), open_clip_encoder.encode_images(x))
    texts = from_pt.encode_texts(TEXTS, batch_size=2)
    assert_unit_rows(texts, 3, 16)
    np.testing.assert_allclose(texts, open_clip_encoder.encode_texts(TEXTS), atol=1e-6)


def test_open_clip_pt_with_pickled_code_is_refused(open_clip_files, tmp_path):
    evil = tmp_path / "evil.pt"
    torch.save({"config": OpenClipEncoder}, evil)  # a class reference: weights_only=True must refuse it
    with pytest.raises(ValueError, match=r"open_clip tiny-vit-test with weights .*evil\.pt.*cannot be built or loaded"):
        OpenClipEncoder(ARCH, evil, device="cpu")


def test_open_clip_random_init_id_names_its_weights(open_clip_files):
    torch.manual_seed(3)
    a = OpenClipEncoder(ARCH, None, device="cpu")
    torch.manual_seed(3)
    b = OpenClipEncoder(ARCH, None, device="cpu")
    assert a.id.startswith(f"open_clip:{ARCH}:random-") and a.id == b.id and len(a.id.split("random-")[1]) == 12


def test_open_clip_preprocess_is_picklable_for_spawned_workers(open_clip_encoder):
    image = Image.fromarray(images(1)[0])
    clone = pickle.loads(pickle.dumps(open_clip_encoder.preprocess))
    torch.testing.assert_close(clone(image), open_clip_encoder.preprocess(image), rtol=0, atol=0)


@pytest.mark.parametrize(
    "arch, weights, error, message",
    [
        ("no-such-arch", None, ValueError, "unknown open_clip architecture 'no-such-arch'"),
        (ARCH, "/nonexistent/weights.safetensors", FileNotFoundError, "does not exist"),
        ("ViT-B-32", "not_a_tag", ValueError, r"'not_a_tag' is not a pretrained tag of ViT-B-32 \(known: .*laion2b_s34b_b79k"),
    ],
)
def test_open_clip_bad_arguments(open_clip_files, arch, weights, error, message):
    with pytest.raises(error, match=message):
        OpenClipEncoder(arch, weights, device="cpu")


def test_open_clip_bad_inputs(open_clip_encoder):
    with pytest.raises(ValueError, match="32x32 pixels"):
        open_clip_encoder.encode_images(torch.zeros(1, 3, 28, 28))
    with pytest.raises(TypeError, match="uint8"):
        open_clip_encoder.encode_images(np.zeros((1, 32, 32, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="batch_size"):
        open_clip_encoder.encode_images(images(1), batch_size=0)
    with pytest.raises(ValueError, match="at least one string"):
        open_clip_encoder.encode_texts([])


def test_open_clip_cached_tag_loads_offline_with_the_tags_settings(open_clip_encoder, open_clip_files, monkeypatch):
    """Offline, a cached tag loads from its file directly, with the tag's QuickGELU flag and normalisation."""
    from pipeline.encoders import openclip as openclip_module

    tags = {"plain": dict(quick_gelu=False, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)), "qgelu": dict(quick_gelu=True)}
    monkeypatch.setattr(open_clip, "get_pretrained_cfg", lambda arch, tag: dict(tags.get(tag, {}), hf_hub="org/repo/") if arch == ARCH else {})
    monkeypatch.setattr(openclip_module, "cached_tag_file", lambda cfg: str(open_clip_files["safetensors"]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    plain = OpenClipEncoder(ARCH, "plain", device="cpu")
    assert plain.id == f"open_clip:{ARCH}:plain"
    normalise = plain.preprocess.transforms[-1]
    assert tuple(normalise.mean) == (0.5, 0.5, 0.5) and tuple(normalise.std) == (0.25, 0.25, 0.25)
    pixels = torch.randn(2, 3, 32, 32)
    np.testing.assert_array_equal(plain.encode_images(pixels), open_clip_encoder.encode_images(pixels))  # same weights
    qgelu = OpenClipEncoder(ARCH, "qgelu", device="cpu")
    assert np.abs(qgelu.encode_images(pixels) - plain.encode_images(pixels)).max() > 1e-4  # QuickGELU changes the activations


def test_open_clip_tag_offline_fails_fast_with_advice():
    tag_cfg = open_clip.get_pretrained_cfg("ViT-B-32", "laion2b_s34b_b79k")
    if cached_tag_file(tag_cfg) is not None:
        pytest.skip("these weights are cached on this machine")
    start = time.perf_counter()
    with pytest.raises(FileNotFoundError, match=r"'ViT-B-32:laion2b_s34b_b79k' is not in the local cache.*local path.*network access"):
        OpenClipEncoder("ViT-B-32", "laion2b_s34b_b79k", device="cpu")
    assert time.perf_counter() - start < 5


# --- transformers ----------------------------------------------------------------------------------


def tiny_clip_tokenizer():
    """A CLIP BPE tokenizer over single characters (no merges): enough to exercise the text path."""
    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in string.ascii_lowercase + string.digits + ".,!'":
        vocab.setdefault(c, len(vocab))
        vocab.setdefault(c + "</w>", len(vocab))
    return CLIPTokenizer(vocab=vocab, merges=[])


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory) -> dict[str, Path]:
    """Tiny random CLIP, DINOv2 and BLIP models with their processors, saved with save_pretrained (safetensors)."""
    from transformers import (
        BitImageProcessor,
        BlipConfig,
        BlipForConditionalGeneration,
        BlipImageProcessor,
        CLIPConfig,
        CLIPImageProcessor,
        CLIPModel,
        Dinov2Config,
        Dinov2Model,
    )

    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    tokenizer = tiny_clip_tokenizer()
    clip = CLIPModel(CLIPConfig(
        text_config=dict(TINY, vocab_size=len(tokenizer), max_position_embeddings=16, bos_token_id=0, eos_token_id=1, pad_token_id=1),
        vision_config=dict(TINY, image_size=32, patch_size=8),
        projection_dim=16,
    ))
    clip.save_pretrained(root / "clip")
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(root / "clip")
    tokenizer.save_pretrained(root / "clip")
    Dinov2Model(Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2, image_size=32, patch_size=8)).save_pretrained(root / "dinov2")
    BitImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(root / "dinov2")
    blip = BlipForConditionalGeneration(BlipConfig(
        vision_config=dict(TINY, image_size=32, patch_size=8),
        text_config=dict(TINY, vocab_size=64, encoder_hidden_size=32, max_position_embeddings=16, pad_token_id=0, bos_token_id=1, sep_token_id=2, eos_token_id=2),
    ))
    blip.save_pretrained(root / "blip")
    BlipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(root / "blip")
    return {"clip": root / "clip", "dinov2": root / "dinov2", "blip": root / "blip"}


def test_hf_clip_matches_the_saved_model(hf_folders):
    from transformers import CLIPModel

    encoder = HFClipEncoder(hf_folders["clip"], device="cpu")
    model = CLIPModel.from_pretrained(hf_folders["clip"]).eval()
    digest = hf_module.weights_digest(model)[:12]
    assert encoder.id == f"hf_clip:{hf_folders['clip']}:{digest}"
    assert (encoder.dim, encoder.has_text, encoder.input_size) == (16, True, (32, 32)) and isinstance(encoder, Encoder)
    x = images(3)
    out = encoder.encode_images(x, batch_size=2)
    assert_unit_rows(out, 3, 16)
    np.testing.assert_array_equal(out, encoder.encode_images(x, batch_size=2))
    pixels = torch.stack([encoder.preprocess(Image.fromarray(im)) for im in x])
    assert pixels.shape == (3, 3, 32, 32)
    with torch.no_grad():
        expected = model.get_image_features(pixel_values=pixels)
        np.testing.assert_allclose(out, reference(getattr(expected, "pooler_output", expected)), atol=1e-6)
    np.testing.assert_allclose(encoder.encode_images(pixels), out, atol=1e-6)
    texts = encoder.encode_texts(TEXTS, batch_size=2)
    assert_unit_rows(texts, 3, 16)
    # padding does not change a text's embedding: alone or batched with longer texts, same vector
    np.testing.assert_allclose(encoder.encode_texts([TEXTS[2]])[0], texts[2], atol=1e-6)


def test_dinov2_uses_the_layernormed_cls_token_and_has_no_text(hf_folders):
    from transformers import AutoModel

    encoder = Dinov2Encoder(str(hf_folders["dinov2"]), device="cpu")
    model = AutoModel.from_pretrained(hf_folders["dinov2"]).eval()
    assert encoder.id == f"dinov2:{hf_folders['dinov2']}:{hf_module.weights_digest(model)[:12]}"
    assert (encoder.dim, encoder.has_text) == (32, False)
    x = images(3)
    out = encoder.encode_images(x)
    assert_unit_rows(out, 3, 32)
    pixels = torch.stack([encoder.preprocess(Image.fromarray(im)) for im in x])
    with torch.no_grad():
        hidden = model(pixel_values=pixels).last_hidden_state  # already after the final layernorm
    np.testing.assert_allclose(out, reference(hidden[:, 0]), atol=1e-6)
    with pytest.raises(TypeError, match="image-only model.*concept naming is unavailable"):
        encoder.encode_texts(["a cat"])


def test_blip_uses_the_pooled_vision_embedding_and_exposes_the_decoder(hf_folders):
    from transformers import BlipForConditionalGeneration

    encoder = BlipEncoder(hf_folders["blip"], device="cpu")
    assert isinstance(encoder.model, BlipForConditionalGeneration) and hasattr(encoder.model, "text_decoder")
    assert (encoder.dim, encoder.has_text, encoder.input_size) == (32, False, (32, 32))
    assert encoder.id.startswith(f"blip:{hf_folders['blip']}:")
    x = images(2)
    out = encoder.encode_images(x)
    assert_unit_rows(out, 2, 32)
    np.testing.assert_array_equal(out, encoder.encode_images(x))
    pixels = torch.stack([encoder.preprocess(Image.fromarray(im)) for im in x])
    with torch.no_grad():
        np.testing.assert_allclose(out, reference(encoder.model.vision_model(pixel_values=pixels).pooler_output), atol=1e-6)
    with pytest.raises(TypeError, match="concept naming is unavailable"):
        encoder.encode_texts(["a cat"])


def test_hf_preprocess_is_picklable_for_spawned_workers(hf_folders):
    encoder = Dinov2Encoder(hf_folders["dinov2"], device="cpu")
    image = Image.fromarray(images(1)[0])
    torch.testing.assert_close(pickle.loads(pickle.dumps(encoder.preprocess))(image), encoder.preprocess(image), rtol=0, atol=0)


@pytest.mark.parametrize("cls, hub_id", [(HFClipEncoder, "openai/clip-vit-base-patch32"), (Dinov2Encoder, "facebook/dinov2-small"),
                                         (BlipEncoder, "Salesforce/blip-image-captioning-base")])
def test_uncached_hub_id_offline_fails_fast_with_advice(cls, hub_id, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub_id = hub_id.replace("/", "/not-cached-")  # a real-looking id that no cache holds
    start = time.perf_counter()
    with pytest.raises(FileNotFoundError, match=rf"'{hub_id}' is not in the local cache.*give a local path.*network access"):
        cls(hub_id, device="cpu")
    assert time.perf_counter() - start < 5


def test_hub_offline_follows_the_variable_and_the_network(monkeypatch):
    monkeypatch.setattr(hf_module, "_host_resolves", lambda host: True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_offline()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    assert not hub_offline()
    monkeypatch.setattr(hf_module, "_host_resolves", lambda host: False)
    assert hub_offline()


def test_missing_local_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no_model: no such model folder"):
        Dinov2Encoder(tmp_path / "no_model", device="cpu")


# --- the registry ----------------------------------------------------------------------------------


def test_load_encoder_builds_every_kind_and_open_encoder_reopens_it(open_clip_files, hf_folders, tmp_path):
    specs = {
        "open_clip": PretrainedSettings(kind="open_clip", arch=ARCH, weights=str(open_clip_files["safetensors"]), device="cpu"),
        "hf_clip": PretrainedSettings(kind="hf_clip", model=str(hf_folders["clip"]), device="cpu"),
        "dinov2": PretrainedSettings(kind="dinov2", model=str(hf_folders["dinov2"]), device="cpu"),
        "blip": PretrainedSettings(kind="blip", model=str(hf_folders["blip"]), device="cpu"),
    }
    dims = {"open_clip": 16, "hf_clip": 16, "dinov2": 32, "blip": 32}
    for kind, spec in specs.items():
        encoder = load_encoder(spec)
        assert isinstance(encoder, Encoder) and encoder.dim == dims[kind]
        assert encoder.id.startswith(f"{kind}:"), encoder.id
        x = images(2, size=32)
        assert_unit_rows(encoder.encode_images(x), 2, dims[kind])
        save_spec(spec, tmp_path / kind, encoder)
        again = open_encoder(tmp_path / kind)
        assert again.id == encoder.id and np.array_equal(again.encode_images(x), encoder.encode_images(x))
    save_embedded(EmbeddedCLIP(16, 8, 32), EmbeddedSettings(embed_dim=16, width=8), tmp_path / "embedded")
    embedded = open_encoder(tmp_path / "embedded", device="cpu")
    assert embedded.id.startswith("embedded:") and embedded.dim == 16
    assert_unit_rows(embedded.encode_images(images(2, size=32)), 2, 16)


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"kind": "clip"}, "kind"),
        ({"arch": "ViT-B-32"}, "kind"),
        ({"kind": "hf_clip"}, "hf_clip needs `model`"),
        ({"kind": "open_clip", "arch": "ViT-B-32", "pretrained": "openai"}, "pretrained"),
        ({"kind": "dinov2", "model": "facebook/dinov2-small", "weights": "x"}, "dinov2 does not take weights"),
        ({"kind": "open_clip", "arch": "ViT-B-32", "device": "tpu9"}, "unknown device 'tpu9'"),
    ],
)
def test_pretrained_settings_reject_bad_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        PretrainedSettings(**spec)
