"""The explanations of a run (pipeline.explanations), the cached caption decoding the evaluate stage relies
on, the explain params and the `cedar explain` error paths. Small synthetic inputs, hand-checked values."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.cli import choose_run, main, preset_text
from pipeline.config import ParamsError, validate_params
from pipeline.explain.captions import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    CaptionDecoder,
    DecoderConfig,
    build_vocabulary,
    decode_captions,
    detokenize,
    train_decoder,
)
from pipeline.explain.naming import LatentNames
from pipeline.explanations import (
    Concepts,
    ExplainSettings,
    KindData,
    best_run,
    best_runs,
    best_score,
    edit_text,
    example_table,
    explain_rows,
    explain_run,
    frequent_latents,
    latent_browser,
    latent_labels,
    latent_list,
    rates_table,
    report_images,
    switched_latents,
    top_activating,
)
from pipeline.models import build

# three images (rows) x four latents; latent 1 and 3 never fire
CODES = np.array([[1.0, 0.0, 2.0, 0.0],
                  [0.0, 0.0, 3.0, 0.0],
                  [2.0, 0.0, 0.0, 0.0]])


# --- small helpers ------------------------------------------------------------------------------------
def test_latent_labels_name_half_axes_plus_then_minus() -> None:
    assert latent_labels(2, signed=True) == ["+0", "+1", "-0", "-1"]
    assert latent_labels(3, signed=False) == ["0", "1", "2"]
    with pytest.raises(ValueError, match="n_latents"):
        latent_labels(0, signed=False)


def test_explain_rows_are_a_seeded_prefix_of_one_permutation() -> None:
    assert explain_rows(5, 3, seed=0).tolist() == np.random.default_rng(0).permutation(5)[:3].tolist()
    assert sorted(explain_rows(4, 10, seed=1).tolist()) == [0, 1, 2, 3]  # size >= n: every row
    assert explain_rows(9, 4, seed=2).tolist() == explain_rows(9, 9, seed=2)[:4].tolist()  # a larger size extends the same order
    with pytest.raises(ValueError, match="size"):
        explain_rows(5, 0, seed=0)


def test_frequent_latents_skip_dead_ones_and_break_ties_by_index() -> None:
    chosen, frequency = frequent_latents(CODES, 3)
    assert chosen.tolist() == [0, 2]  # both active on 2 of 3 images; 1 and 3 never
    np.testing.assert_allclose(frequency, [2 / 3, 0, 2 / 3, 0])
    assert frequent_latents(CODES, 1)[0].tolist() == [0]
    with pytest.raises(ValueError, match="non-negative"):
        frequent_latents(-CODES, 2)


def test_top_activating_rows_are_largest_first_and_active_only() -> None:
    assert top_activating(CODES, np.array([0, 2]), 2) == [[2, 0], [1, 0]]
    assert top_activating(CODES, np.array([0, 1]), 3) == [[2, 0], []]  # row 1 is inactive for latent 0


def test_latent_list_maps_positions_to_dataset_rows() -> None:
    names = LatentNames(names=np.array([["a", "b"], ["c", "d"], ["e", "f"], ["g", "h"]], dtype=object),
                        scores=np.array([[0.9, 0.5], [0.8, 0.1], [0.7, 0.6], [0.3, 0.2]], dtype=np.float32),
                        indices=np.zeros((4, 2), np.int64))
    listed = latent_list(CODES, np.array([10, 11, 12]), names, ["w", "x", "y", "z"], count=5, images=1)
    assert [entry["latent"] for entry in listed] == ["w", "y"]
    assert listed[0]["names"] == ["a", "b"] and listed[0]["scores"] == pytest.approx([0.9, 0.5])
    assert listed[0]["top_images"] == [12] and listed[1]["top_images"] == [11]
    assert listed[1]["frequency"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="rows"):
        latent_list(CODES, np.array([10, 11]), names, ["w", "x", "y", "z"], count=5, images=1)


def test_switched_latents_list_on_and_off_by_strength() -> None:
    before = np.array([[1.0, 0.0, 0.5, 0.0]])
    after = np.array([[0.0, 2.0, 0.5, 3.0]])
    labels, best = ["+0", "+1", "-0", "-1"], ["red", "blue", "round", "flat"]
    (pair,) = switched_latents(before, after, labels, best, limit=8)
    assert pair["on"] == [{"latent": "-1", "name": "flat"}, {"latent": "+1", "name": "blue"}]  # 3.0 before 2.0; -0 stayed on
    assert pair["off"] == [{"latent": "+0", "name": "red"}]
    assert switched_latents(before, after, labels, best, limit=1)[0]["on"] == [{"latent": "-1", "name": "flat"}]
    assert switched_latents(before, before, labels, best, limit=2) == [{"on": [], "off": []}]
    with pytest.raises(ValueError, match="after"):
        switched_latents(before, after[:, :3], labels, best, limit=1)


def test_edit_text_words_an_edit_or_a_removal() -> None:
    names = ["red body", "blue body", "tree"]
    assert edit_text(names, 0, 1) == "red body → blue body"
    assert edit_text(names, 2, -1) == "tree removed"
    with pytest.raises(ValueError, match="removed/added"):
        edit_text(names, 3, -1)


def metrics(run: str, method: str, objects: float | None, multi: float = 0.0) -> dict:
    concepts = {"multi": {"trained": {"match_score": multi}}}
    if objects is not None:
        concepts = {"objects": {"trained": {"match_score": objects}}, **concepts}
    return {"run": run, "method": method, "concepts": concepts}


def test_best_runs_use_the_objects_match_score() -> None:
    runs = [metrics("cedar-8", "cedar", 0.4, multi=0.9), metrics("cedar-16", "cedar", 0.6), metrics("topk-64-8", "topk", 0.5),
            metrics("topk-128-8", "topk", float("nan"))]
    assert best_runs(runs) == {"cedar": "cedar-16", "topk": "topk-64-8"}
    assert best_run(runs) == "cedar-16"
    assert best_score(metrics("x", "m", None, multi=0.3)) == 0.3  # no objects kind: the first kind
    assert best_score({"run": "x", "method": "m", "concepts": {}}) == float("-inf")
    assert best_runs([metrics("a", "m", 0.5), metrics("b", "m", 0.5)]) == {"m": "a"}  # ties: the first
    with pytest.raises(ValueError, match="runs"):
        best_run([])


# --- a whole run, hand-checkable --------------------------------------------------------------------
COLOURS = ["red", "green", "blue", "yellow"]
CAPTIONS = [f"a {c} thing" for c in COLOURS]


@pytest.fixture(scope="module")
def setup() -> dict:
    """Identity basis around b (d = 4, k = 1); image j is b + e_j, captioned "a <colour j> thing" and labelled
    colour j; the vocabulary's text embeddings are e_0..e_3, named by the colours. Every image is exactly
    1-sparse around b, so its sparse reconstruction and its original-basis top-1 code equal the image."""
    b = np.array([0.5, -0.2, 0.1, 0.3], dtype=np.float32)
    x = (b + np.eye(4)).astype(np.float32)
    model = build("identity", 4, 4, 1)
    model.mean = b
    config = DecoderConfig(width=32, heads=2, layers=1, dropout=0.0, drop_max=0.0, noise_std=0.0, epochs=60, batch_size=4, lr=5e-3, device="cpu")
    decoder, _ = train_decoder(x, CAPTIONS, config, seed=0)
    assert decode_captions(decoder, x) == CAPTIONS  # memorised: the rates below are then exact
    kind = KindData(kind="objects", rows=np.array([40, 41, 42, 43]), x=x, attributes=np.eye(4, dtype=bool), attribute_names=COLOURS,
                    families={"colour": [0, 1, 2, 3]}, truth=CAPTIONS, scored=True, pair_ids=np.array([7]),
                    pairs_before=x[:1], pairs_after=x[1:2], pair_edits=["red → green"])
    concepts = Concepts(texts=COLOURS, embeddings=np.eye(4, dtype=np.float32))
    settings = ExplainSettings(top_names=2, top_m=2, caption_ks=(2, 9), examples=2, pairs=3, latents=10, top_images=3)
    return {"model": model, "decoder": decoder, "kind": kind, "concepts": concepts, "b": b, "settings": settings}


def test_explain_run_names_scores_and_captions_hand_checked(setup: dict) -> None:
    e = explain_run(setup["model"], 1, setup["decoder"], [setup["kind"]], setup["concepts"], setup["b"], setup["settings"])
    assert (e["k"], e["signed"], e["n_latents"], e["named"]) == (1, True, 8, True)
    # +j fires on image j only (frequency 1/4 each), -j never: four listed latents, named by colour j first
    assert [entry["latent"] for entry in e["latents"]] == ["+0", "+1", "+2", "+3"]
    assert [entry["names"][0] for entry in e["latents"]] == COLOURS
    assert [entry["top_images"] for entry in e["latents"]] == [[40], [41], [42], [43]]
    assert all(entry["frequency"] == 0.25 for entry in e["latents"])
    # centred concepts e_i - 1/4: cos(+e_j, e_j - 1/4) = 0.75 / sqrt(0.75) = sqrt(0.75)
    assert e["latents"][0]["scores"][0] == pytest.approx(np.sqrt(0.75), abs=1e-6)
    # model: one named concept per image, always right; dense (top 2): the right one and a wrong one
    assert e["relevance"]["objects"] == {"m": 2, "model": {"precision": 1.0, "recall": 1.0, "n_images": 4, "n_empty": 0},
                                         "dense": {"precision": 0.5, "recall": 1.0, "n_images": 4, "n_empty": 0}}
    assert e["describes"]["objects"] == {"n_images": 4, "k": 1, "dense": 1.0, "sparse": 1.0, "topk_original": 1.0,
                                         "attribute_precision": {"dense": 1.0, "sparse": 1.0, "topk_original": 1.0}}
    # k = 9 > d is skipped; k = 1 (the run's) and 2 are captioned from both sparse sources
    assert sorted({(p["k"], p["source"]) for p in e["describes_curve"]}) == [(1, "sparse"), (1, "topk_original"), (2, "sparse"), (2, "topk_original")]
    first = e["examples"][0]
    assert len(e["examples"]) == 2 and first["row"] == 40 and first["attributes"] == ["red"]
    assert first["concepts"] == [["red", 1.0]] and first["dense_concepts"][0][0] == "red"
    assert first["captions"] == {"dense": "a red thing", "sparse": "a red thing", "topk_original": "a red thing"}
    assert first["describes"] == {"dense": True, "sparse": True, "topk_original": True}
    assert e["pairs"] == [{"kind": "objects", "pair": 7, "edit": "red → green", "on": [{"latent": "+1", "name": "green"}],
                           "off": [{"latent": "+0", "name": "red"}]}]
    json.dumps(e, allow_nan=False)  # strict JSON


def test_explain_run_without_a_concept_vocabulary_still_captions(setup: dict) -> None:
    e = explain_run(setup["model"], 1, setup["decoder"], [setup["kind"]], None, setup["b"], setup["settings"])
    assert e["named"] is False and e["relevance"] == {}
    assert all(entry["names"] == [] for entry in e["latents"])
    assert e["describes"]["objects"]["dense"] == 1.0 and e["examples"][0]["concepts"] == []


def test_explain_run_errors_are_clear(setup: dict) -> None:
    args = (setup["decoder"], [setup["kind"]], setup["concepts"], setup["b"], setup["settings"])
    with pytest.raises(ValueError, match="k: expected an int in 1..4"):
        explain_run(setup["model"], 5, *args)
    with pytest.raises(ValueError, match="image_mean"):
        explain_run(setup["model"], 1, setup["decoder"], [setup["kind"]], setup["concepts"], setup["b"][:3], setup["settings"])
    with pytest.raises(ValueError, match="kinds"):
        explain_run(setup["model"], 1, setup["decoder"], [], setup["concepts"], setup["b"], setup["settings"])
    with pytest.raises(ValueError, match="attributes: expected bool"):
        KindData(kind="objects", rows=np.array([0]), x=np.zeros((1, 4), np.float32), attributes=np.zeros((1, 2), int),
                 attribute_names=["a", "b"], families={}, truth=["t"], scored=True)
    with pytest.raises(ValueError, match="ExplainSettings: top_m"):
        ExplainSettings(top_m=0)


def test_captions_of_a_complete_kind_are_judged_against_every_column(setup: dict) -> None:
    """A caption stating another kind's attribute ("tree") is wrong on a kind whose labels are complete."""
    kind = setup["kind"]
    judged = KindData(kind="objects", rows=kind.rows, x=kind.x, attributes=kind.attributes, attribute_names=COLOURS, families=kind.families,
                      truth=CAPTIONS, scored=True, caption_attributes=np.eye(4, 5, dtype=bool), caption_names=COLOURS + ["thing"],
                      caption_families={"colour": [0, 1, 2, 3], "object": [4]})
    e = explain_run(setup["model"], 1, setup["decoder"], [judged], None, setup["b"], setup["settings"])
    assert e["describes"]["objects"]["dense"] == 0.0  # "a red thing" states "thing", false on every image
    assert e["describes"]["objects"]["attribute_precision"]["dense"] == 0.5  # ... and its colour, true


# --- the report's view ---------------------------------------------------------------------------------
def test_report_view_puts_the_best_runs_side_by_side(setup: dict) -> None:
    e = explain_run(setup["model"], 1, setup["decoder"], [setup["kind"]], setup["concepts"], setup["b"], setup["settings"])
    explains = {"identity-1": {"run": "identity-1", "method": "identity", **e}, "identity-2": {"run": "identity-2", "method": "identity", **e}}
    runs = [metrics("identity-1", "identity", 0.7), metrics("identity-2", "identity", 0.2)]
    best = best_runs(runs)
    browser = latent_browser(runs, explains, best)
    assert [(b["method"], b["run"], b["score"]) for b in browser] == [("identity", "identity-1", 0.7)]
    examples = example_table(explains, best)
    assert [x["row"] for x in examples] == [40, 41] and examples[0]["dense_caption"] == "a red thing"
    assert examples[0]["runs"] == [{"method": "identity", "run": "identity-1", "k": 1, "concepts": [["red", 1.0]],
                                    "captions": {"sparse": "a red thing", "topk_original": "a red thing"},
                                    "describes": {"sparse": True, "topk_original": True}}]
    table = rates_table(list(explains.values()))
    assert [r["run"] for r in table["objects"]] == ["identity-1", "identity-2"]
    assert table["objects"][0]["relevance"]["dense_precision"] == 0.5 and table["objects"][0]["sparse"] == 1.0
    assert table["objects"][0]["attribute_precision"] == {"dense": 1.0, "sparse": 1.0, "topk_original": 1.0}
    assert report_images(browser, examples) == ([40, 41, 42, 43], [7])


# --- cached greedy decoding ------------------------------------------------------------------------------
@torch.no_grad()
def greedy_by_full_forward(decoder: CaptionDecoder, x: np.ndarray, max_len: int) -> list[str]:
    """The reference: re-run `forward` over the whole sequence at every step."""
    steps = min(max_len, decoder.config.max_tokens - 1) + 1
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
    decoder = CaptionDecoder(5, vocab, DecoderConfig(width=32, heads=4, layers=2, max_tokens=max_tokens)).eval()
    with torch.no_grad():  # a random decoder rarely emits <eos> early: captions of every length up to the cap
        decoder.head.bias[EOS_ID] = -1.0
    x = np.random.default_rng(0).standard_normal((7, 5)).astype(np.float32)
    expected = greedy_by_full_forward(decoder, x, max_len)
    assert decode_captions(decoder, x, max_len=max_len) == expected
    assert max(len(c.split()) for c in expected) == min(max_len, max_tokens - 1)


# --- params and the CLI --------------------------------------------------------------------------------------
def test_explain_params_validate_and_map_to_settings() -> None:
    import yaml

    raw = yaml.safe_load(preset_text("tiny"))
    params = validate_params(raw)
    assert params.explain.settings().caption_ks == (1, 2, 4, 8, 16)
    assert params.explain.decoder.config().width == 64
    raw["explain"] = {"decoder": {"width": 30, "heads": 4}, "top_m": 0}
    with pytest.raises(ParamsError) as error:
        validate_params(raw)
    assert "explain.decoder: DecoderConfig: width (30) must be divisible by heads (4)" in str(error.value)
    assert "explain.top_m" in str(error.value)


def test_choose_run_names_the_known_runs_or_takes_the_best() -> None:
    names = ["cedar-4", "topk-32-4"]
    assert choose_run(names, [metrics("cedar-4", "cedar", 0.3), metrics("topk-32-4", "topk", 0.5)], None) == "topk-32-4"
    assert choose_run(names, [], "cedar-4") == "cedar-4"
    with pytest.raises(ValueError, match="unknown run 'nope'; known runs: cedar-4, topk-32-4"):
        choose_run(names, [], "nope")
    with pytest.raises(FileNotFoundError, match="no evaluated run"):
        choose_run(names, [], None)


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    """A project root with the tiny params and a dataset stub (only the image size is read before the checks)."""
    (tmp_path / "params.yaml").write_text(preset_text("tiny"))
    (tmp_path / "store" / "data").mkdir(parents=True)
    (tmp_path / "store" / "data" / "meta.json").write_text(json.dumps({"image_size": 32, "kinds": {}}))
    return tmp_path


def run_cli(project: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["explain", *args, "--params", str(project / "params.yaml"), "--root", str(project)])
    return code, capsys.readouterr().err.strip()


def test_cli_explain_unknown_run_lists_the_known_ones(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(project, capsys, str(project / "x.png"), "--run", "nope")
    assert code == 2 and err == "error: unknown run 'nope'; known runs: cedar-4, topk-32-4"


def test_cli_explain_unreadable_image_is_one_line(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = project / "bad.png"
    bad.write_text("not an image")
    code, err = run_cli(project, capsys, str(bad), "--run", "cedar-4")
    assert code == 2 and err.startswith(f"error: {bad}: unreadable image (") and "\n" not in err
    code, err = run_cli(project, capsys, str(project / "missing.png"), "--run", "cedar-4")
    assert code == 2 and err == f"error: {project / 'missing.png'}: unreadable image (file not found)"


def test_cli_explain_without_evaluated_runs_says_what_to_do(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(project, capsys, str(project / "x.png"))
    assert code == 2 and "no evaluated run under store/eval" in err
