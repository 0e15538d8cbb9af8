"""The caption decoder (pipeline.explain.tokens, .decoder), caption sources (.captions) and the BLIP wiring (.blip)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.data.world.scenes import generate_objects
from pipeline.explain.blip import blip_captions, blip_image_embeddings
from pipeline.explain.caption_sources import caption_sources, topk_original_basis
from pipeline.explain.decoder import CaptionDecoder, _augment, decode_captions, load_decoder, save_decoder, train_decoder
from pipeline.explain.options import DecoderSettings
from pipeline.explain.tokens import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID, build_vocabulary, detokenize, tokenize
from pipeline.models.registry import build
from pipeline.training.options import TrainSettings

# a small, augmentation-free configuration that memorises 20 pairs in a few seconds
OVERFIT = DecoderSettings(width=64, layers=2, heads=4, dropout=0.0, drop_max=0.0, noise_std=0.0,
                          train=TrainSettings(epochs=150, min_steps=0, batch_size=20, lr=3e-3, weight_decay=0.01, min_lr_frac=0.0))


@pytest.fixture(scope="module")
def pairs() -> tuple[np.ndarray, list[str]]:
    captions = generate_objects(20, image_size=32, seed=0).captions
    x = np.random.default_rng(0).standard_normal((20, 16)).astype(np.float32)
    return x, captions


@pytest.fixture(scope="module")
def overfit(pairs: tuple[np.ndarray, list[str]]) -> CaptionDecoder:
    decoder, _ = train_decoder(*pairs, OVERFIT, seed=0)
    return decoder


# --- tokenizer ----------------------------------------------------------------------------------------
def test_tokenize_round_trips_scene_captions() -> None:
    captions = generate_objects(50, image_size=32, seed=1).captions
    assert tokenize("a big, medium-sized star; it is round") == ["a", "big", ",", "medium-sized", "star", ";", "it", "is", "round"]
    assert all(detokenize(tokenize(c)) == c for c in captions)


def test_vocabulary_is_special_tokens_then_words_by_frequency() -> None:
    assert build_vocabulary(["b a b", "c b a"]) == list(SPECIAL_TOKENS) + ["b", "a", "c"]
    assert build_vocabulary(["b a b", "c b a"], min_count=2) == list(SPECIAL_TOKENS) + ["b", "a"]
    with pytest.raises(ValueError, match="empty vocabulary"):
        build_vocabulary(["", "  "])
    with pytest.raises(ValueError, match="captions: expected at least one"):
        build_vocabulary([])


def test_teacher_forcing_tensors_are_shifted_and_padded() -> None:
    decoder = CaptionDecoder(3, build_vocabulary(["a b", "c"]), DecoderSettings(width=16, heads=2))
    inputs, targets = decoder.encode_captions(["a b", "c zebra"])
    a, b, c = (decoder.token_id[w] for w in "abc")
    assert inputs.tolist() == [[1, a, b], [1, c, 3]]  # <bos> = 1, unknown "zebra" -> <unk> = 3
    assert targets.tolist() == [[a, b, 2], [c, 3, 2]]  # <eos> = 2


# --- training and decoding ----------------------------------------------------------------------------
def test_decoder_overfits_twenty_captions_exactly(pairs: tuple[np.ndarray, list[str]], overfit: CaptionDecoder) -> None:
    x, captions = pairs
    assert decode_captions(overfit, x) == captions


def test_batched_decoding_equals_one_at_a_time(pairs: tuple[np.ndarray, list[str]], overfit: CaptionDecoder) -> None:
    x, _ = pairs
    noisy = x + 0.7 * np.random.default_rng(1).standard_normal(x.shape).astype(np.float32)  # varied caption lengths
    together = decode_captions(overfit, noisy)
    assert decode_captions(overfit, noisy, batch_size=1) == together
    assert decode_captions(overfit, noisy, batch_size=7) == together


def test_max_len_caps_the_number_of_tokens(pairs: tuple[np.ndarray, list[str]], overfit: CaptionDecoder) -> None:
    x, captions = pairs
    short = decode_captions(overfit, x[:3], max_len=4)
    assert short == [detokenize(tokenize(c)[:4]) for c in captions[:3]]


def test_training_is_deterministic_and_history_is_filled(pairs: tuple[np.ndarray, list[str]]) -> None:
    x, captions = pairs
    settings = DecoderSettings(width=32, heads=2, layers=1, train=TrainSettings(epochs=3, min_steps=0, batch_size=8, lr=2e-3))
    first, history = train_decoder(x, captions, settings, seed=5)
    second, _ = train_decoder(x, captions, settings, seed=5)
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), name
    assert [h["epoch"] for h in history] == [1, 2, 3] and all(0 <= h["train_token_accuracy"] <= 1 for h in history)
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    np.testing.assert_allclose(first.input_mean.numpy(), x.mean(0), atol=1e-6)


def test_augmentation_shrinks_or_keeps_norms_and_is_off_when_disabled() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(50, 8)
    assert torch.equal(_augment(x, 0.0, 0.0, generator), x)
    dropped = _augment(x, 0.9, 0.0, generator)
    assert (dropped.norm(dim=1) <= x.norm(dim=1) + 1e-5).all()  # coordinates are removed in a rotated basis, never added
    assert (dropped.norm(dim=1) < x.norm(dim=1) - 1e-3).float().mean() > 0.5


def test_save_load_round_trip_is_identical(tmp_path: Path, pairs: tuple[np.ndarray, list[str]], overfit: CaptionDecoder) -> None:
    x, _ = pairs
    save_decoder(overfit, tmp_path / "decoder")
    loaded = load_decoder(tmp_path / "decoder")
    assert sorted(p.name for p in (tmp_path / "decoder").iterdir()) == ["config.json", "model.safetensors"]
    assert loaded.vocab == overfit.vocab and loaded.settings == overfit.settings
    for (name, a), b in zip(overfit.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name
    probe = x + 0.5
    assert decode_captions(loaded, probe) == decode_captions(overfit, probe)
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_decoder(tmp_path / "missing")


def test_decoder_errors_are_clear(pairs: tuple[np.ndarray, list[str]], overfit: CaptionDecoder) -> None:
    x, captions = pairs
    with pytest.raises(ValueError, match="embeddings: expected 16 columns"):
        decode_captions(overfit, np.zeros((2, 15), np.float32))
    with pytest.raises(ValueError, match="captions: expected 20 captions"):
        train_decoder(x, captions[:19], OVERFIT)
    with pytest.raises(TypeError, match="expected a float array"):
        train_decoder(x.astype(np.int64), captions, OVERFIT)
    with pytest.raises(ValueError, match="NaN"):
        train_decoder(np.full_like(x, np.nan), captions, OVERFIT)
    with pytest.raises(ValueError, match="empty vocabulary"):
        train_decoder(x[:2], ["", " "], OVERFIT)
    with pytest.raises(ValueError, match="divisible"):
        DecoderSettings(width=30, heads=4)
    with pytest.raises(ValueError, match="drop_max"):
        DecoderSettings(drop_max=1.0)
    with pytest.raises(ValueError, match="max_len"):
        decode_captions(overfit, x, max_len=0)


# --- caption sources ----------------------------------------------------------------------------------
def test_topk_original_basis_hand_computed() -> None:
    x = np.array([[3.0, -1.0, 0.5], [0.0, 0.0, -4.0]], np.float32)
    mean = np.array([1.0, 0.0, 0.0], np.float32)
    expected = np.array([[3.0, -1.0, 0.0], [0.0, 0.0, -4.0]], np.float32)  # centred rows (2, -1, .5), (-1, 0, -4)
    np.testing.assert_array_equal(topk_original_basis(x, mean, 2), expected)
    np.testing.assert_array_equal(topk_original_basis(x, mean, 3), x)
    with pytest.raises(ValueError, match="k: expected"):
        topk_original_basis(x, mean, 4)


def test_caption_sources_compare_dense_sparse_and_original_topk(pairs: tuple[np.ndarray, list[str]], overfit: CaptionDecoder) -> None:
    x, captions = pairs
    identity = build("identity", d=16, dict_size=16, k=4)
    identity.mean = overfit.input_mean.numpy()  # same centre as the original-basis top-k
    sources = caption_sources(identity, x, 4, overfit)
    assert sources.dense == captions
    assert sources.sparse == sources.topk_original  # no rotation: the two sparse codes coincide
    full = caption_sources(build("random_rotation", d=16, dict_size=16, k=4, seed=0), x, 16, overfit)
    assert full.sparse == captions and full.topk_original == captions  # k = d is exact
    sae = build("topk", d=16, dict_size=32, k=4, seed=0)
    expected = decode_captions(overfit, sae.decode(sae.encode(x, 4)))
    assert caption_sources(sae, x, 4, overfit).sparse == expected
    with pytest.raises(ValueError, match="x: expected 16 columns"):
        caption_sources(identity, x[:, :8], 4, overfit)


# --- BLIP -----------------------------------------------------------------------------------------------
def _tiny_blip() -> tuple[object, object]:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BlipConfig, BlipForConditionalGeneration, PreTrainedTokenizerFast

    words = ["[PAD]", "[BOS]", "[SEP]", "[UNK]"] + [f"w{i}" for i in range(28)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", bos_token="[BOS]", sep_token="[SEP]", unk_token="[UNK]")
    config = BlipConfig(
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=32,
                           patch_size=16, initializer_range=0.5),
        text_config=dict(vocab_size=32, hidden_size=16, encoder_hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=32, bos_token_id=1, sep_token_id=2, eos_token_id=2,
                         pad_token_id=0, initializer_range=0.5),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = BlipForConditionalGeneration(config).eval()
    return model, tokenizer


def test_blip_wiring_with_a_tiny_random_model(tmp_path: Path) -> None:
    model, tokenizer = _tiny_blip()
    pixels = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    from_pixels = blip_captions(model, pixels, tokenizer=tokenizer, max_new_tokens=5)
    sequence = blip_image_embeddings(model, pixels)
    assert sequence.shape == (3, 5, 16)  # CLS + 2 x 2 patches, BLIP vision width 16
    assert len(from_pixels) == 3 and all(isinstance(c, str) for c in from_pixels)
    assert all(set(c.split()) <= {f"w{i}" for i in range(28)} for c in from_pixels)
    # the embedding path feeds the same sequence to the same text decoder
    assert blip_captions(model, sequence, tokenizer=tokenizer, max_new_tokens=5) == from_pixels
    # a (n, H) vector is a length-1 sequence; other embeddings give other captions
    as_vectors = blip_captions(model, sequence[:, 0], tokenizer=tokenizer, max_new_tokens=5)
    assert as_vectors == blip_captions(model, sequence[:, :1], tokenizer=tokenizer, max_new_tokens=5)
    random_sequence = 3 * np.random.default_rng(0).standard_normal((3, 4, 16)).astype(np.float32)
    other = blip_captions(model, random_sequence, tokenizer=tokenizer, max_new_tokens=5)
    assert other != from_pixels
    # a local folder goes through from_pretrained(local_files_only=True), the tokenizer saved beside it
    model.save_pretrained(tmp_path / "blip")
    tokenizer.save_pretrained(tmp_path / "blip")
    assert blip_captions(tmp_path / "blip", sequence, max_new_tokens=5) == from_pixels
    with pytest.raises(ValueError, match="width 16"):
        blip_captions(model, np.zeros((2, 4, 8), np.float32), tokenizer=tokenizer)
    with pytest.raises(FileNotFoundError, match="not a local BLIP folder"):
        blip_captions(tmp_path / "nothing", sequence, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="tokenizer"):
        blip_captions(model, sequence)


# --- cached greedy decoding ------------------------------------------------------------------------------
@torch.no_grad()
def greedy_by_full_forward(decoder: CaptionDecoder, x: np.ndarray, max_len: int) -> list[str]:
    """The reference: re-run `forward` over the whole sequence at every step."""
    steps = min(max_len, decoder.settings.max_tokens - 1) + 1
    x_std = decoder.standardise(torch.as_tensor(x))
    tokens = torch.full((len(x), 1), BOS_ID, dtype=torch.long)
    done = torch.zeros(len(x), dtype=torch.bool)
    banned = torch.zeros(len(decoder.vocab), dtype=torch.bool)
    banned[[PAD_ID, BOS_ID, UNK_ID]] = True
    for _ in range(steps):
        logits = decoder(x_std, tokens)[:, -1].masked_fill(banned, float("-inf"))
        nxt = torch.where(done, torch.full_like(done, PAD_ID, dtype=torch.long), logits.argmax(-1))
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)
        done |= nxt == EOS_ID
        if bool(done.all()):
            break
    out = []
    for row in tokens[:, 1:].numpy():
        end = np.flatnonzero((row == EOS_ID) | (row == PAD_ID))
        out.append(detokenize([decoder.vocab[i] for i in (row[: end[0]] if len(end) else row[: steps - 1])]))
    return out


@pytest.mark.parametrize("max_tokens, max_len", [(6, 24), (32, 24), (32, 3)])
def test_cached_decoding_equals_rerunning_the_whole_sequence(max_tokens: int, max_len: int) -> None:
    torch.manual_seed(0)
    vocab = build_vocabulary(["a red round thing on grass", "the blue square sits in snow , big"])
    decoder = CaptionDecoder(5, vocab, DecoderSettings(width=32, heads=4, layers=2, max_tokens=max_tokens)).eval()
    with torch.no_grad():  # a random decoder rarely emits <eos> early: captions of every length up to the cap
        decoder.head.bias[EOS_ID] = -1.0
    x = np.random.default_rng(0).standard_normal((7, 5)).astype(np.float32)
    expected = greedy_by_full_forward(decoder, x, max_len)
    assert decode_captions(decoder, x, max_len=max_len) == expected
    assert max(len(c.split()) for c in expected) == min(max_len, max_tokens - 1)
