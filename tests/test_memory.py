"""Bounded memory: the evaluate stage's peak RSS on 200,000 synthetic rows stays under a bound derived from its batch
and subset sizes, measured (resource.getrusage in a child process), not estimated.

The project: 200k planted-concept embeddings (d = 32, 4 families x 8 values), 70% of them in the test split
(140,000 test rows), a TopK SAE with 1,024 latents and k = 8 trained for a few steps. Dense codes of the test split
alone would take 140,000 x 1,024 x 4 bytes = 573 MB; the budget below is less than that, so an evaluation that
materialised them (or the test split's embeddings, labels, reconstructions) would fail it.

Measured in a child process: it imports and loads what the stage needs (the fixed cost: interpreter, torch and the torch._dynamo that its optimizers import,
scikit-learn, a model, the caption decoder, the dataset's indices), gives freed heap back to the system (glibc
malloc_trim, so that memory the imports freed cannot absorb a growth unseen), resets its peak RSS (Linux
/proc/self/clear_refs), runs the stage and reads the peak the kernel recorded (VmHWM in /proc/self/status: the
figure getrusage's ru_maxrss reports, which itself cannot be reset once a helper thread has exited; the process's
overall ru_maxrss is printed too). What the evaluation added must stay under a budget
computed from the settings:
one encoding batch dense (embeddings, reconstructions, and eight (batch, latents) float32 buffers for the encoder's
pre-activations, activations, top-k selection, codes and latents), the matching rows (embeddings for the probes, labels,
sparse codes), the FMS/CKNNA pool (labels, sparse codes, its dense slices for the trees), the CKNNA kernels and
masks, the explanation rows, and the per-row indices of the dataset (split and kind: 2 bytes per row, row ids of the
test split: 8 bytes per row) and the two models it loads and builds, each with a factor of 3 for temporaries and
allocator slack.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.config import validate_params
from pipeline.paths import Layout

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

N, D, LATENTS, K, FAMILIES, VALUES = 200_000, 32, 1024, 8, 4, 8
PARAMS = {
    "seed": 0,
    "data": {"source": "synthetic", "n": N, "d": D, "families": FAMILIES, "values": VALUES, "n_pairs": 200, "split": [0.25, 0.05, 0.70]},
    "train": {"batch_size": 256, "epochs": 1, "max_steps": 5, "lr": 0.001, "val_samples": 2000, "init_samples": 4000},
    "sweep": {"rotation": {"methods": ["identity"], "ks": [K]}, "sae": {"methods": ["topk"], "dict_sizes": [LATENTS], "ks": [K]}},
    "methods": {"identity": {}, "topk": {}},
    "evaluate": {"batch_size": 2048, "max_match_rows": 5000, "max_test_rows": 5000, "cknna_max_n": 1000, "fms_max_n": 1000, "ks": [K],
                 "fms_removals": [1, 2]},
    "captions": {"width": 32, "layers": 1, "heads": 2, "max_pairs": 500, "train": {"epochs": 1, "batch_size": 128}},
    "explain": {"caption_images": 50, "max_rows": 500, "latents": 16},
    "report": {"title": "memory test"},
}

CHILD = """
import ctypes, json, resource, sys
from pathlib import Path
import sklearn.linear_model, sklearn.tree, scipy.stats  # noqa: F401  imported before the measurement starts
import torch._dynamo  # noqa: F401  a library, not evaluation data: every torch.optim optimizer (the probes' L-BFGS) imports it on construction, ~130 MB
from pipeline.config import load_params
from pipeline.data.dataset import open_dataset
from pipeline.explain.decoder import load_decoder
from pipeline.models.checkpoint import load_model
from pipeline.paths import Layout
from pipeline.store import open_store
from stages import evaluate
root = Path(sys.argv[1]); params = load_params(root / "params.yaml"); layout = Layout(root); cell = params.cells()[-1]
# the fixed cost, paid before the measurement: interpreter and libraries, a model, the decoder, the dataset's indices
model, decoder, data = load_model(layout.model(cell.name)), load_decoder(layout.captions), open_dataset(layout.data)
split, store = data.split, open_store(layout.image_embeddings)
def status_mb(key):  # the kernel's own counters of this process: VmRSS (now), VmHWM (peak since the last reset)
    return int(next(line for line in open("/proc/self/status") if line.startswith(key)).split()[1]) / 1024
fixed = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
ctypes.CDLL("libc.so.6").malloc_trim(0)  # glibc: give freed heap back, so reused free memory cannot hide a growth
open("/proc/self/clear_refs", "w").write("5")  # Linux: resets the peak RSS (VmHWM) to the current RSS
start = status_mb("VmHWM")
evaluate.run(params, layout, cell)
print(json.dumps({"fixed_peak_mb": fixed, "start_mb": start, "peak_mb": status_mb("VmHWM"),
                  "process_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def measure(root: Path) -> dict[str, float]:
    """The evaluate stage in a child: its RSS when everything is loaded, and its peak RSS during the evaluation."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", CHILD, str(root)], env=env, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def budget_mb(params) -> float:
    """What evaluation may add to the fixed cost: a function of the batch and subset sizes (see the module docstring)."""
    e, x, d, latents, a = params.evaluate, params.explain, D, LATENTS, FAMILIES * VALUES
    sparse_row = K * 12  # float32 value + int32 index (+ int32 coordinate while converting) per non-zero
    terms = {
        "batch": e.batch_size * (2 * d + 8 * latents) * 4,  # embeddings, x_hat; the encoder's (batch, latents) working buffers
        "matching": e.max_match_rows * (d * 8 + a + sparse_row),  # float64 copy for the probe fit, labels, codes
        "pool": e.max_test_rows * (a + sparse_row) + e.fms_max_n * latents * 4,  # labels, codes, a dense tree slice
        "cknna": e.cknna_max_n ** 2 * 8 * 6,  # two float64 kernels, masks and masked copies
        "explain": x.max_rows * (d * 4 + a + sparse_row),
        "rows": N * 2 + N * 8,  # split and kind (1 byte each per row), int64 ids of test rows
        "models": 2 * 2 * LATENTS * d * 4,  # the stage loads its own model and builds the untrained twin
    }
    return 3 * sum(terms.values()) / 2**20


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    from pipeline.training.cell_training import train_cell
    from stages import captions, data, encoder, extract, probes

    root = tmp_path_factory.mktemp("memory")
    (root / "params.yaml").write_text(yaml.safe_dump(PARAMS, sort_keys=False))
    params = validate_params(PARAMS)
    layout = Layout(root)
    for stage in (data, encoder, extract, captions, probes):
        stage.run(params, layout)
    train_cell(params, layout, params.cells()[-1])
    return root


def test_evaluate_peak_rss_on_200k_rows_is_bounded_by_batch_and_subset_sizes(project):
    params = validate_params(PARAMS)
    rss = measure(project)
    growth, budget = rss["peak_mb"] - rss["start_mb"], budget_mb(params)
    n_test = int(N * 0.70)
    dense_codes_mb = n_test * LATENTS * 4 / 2**20
    assert budget < dense_codes_mb, "the bound must catch dense codes of the test split"
    assert growth <= budget, f"evaluate grew the RSS by {growth:.0f} MB (from {rss['start_mb']:.0f} to {rss['peak_mb']:.0f}) > budget {budget:.0f} MB"
    metrics = json.loads(Layout(project).run_metrics(params.cells()[-1].name).read_text())
    assert metrics["n_test"] == n_test and metrics["trained"]["n"] == n_test, "every test row was streamed"
    print(f"evaluate: RSS {rss['start_mb']:.0f} MB loaded, peak {rss['peak_mb']:.0f} MB: +{growth:.0f} MB <= budget {budget:.0f} MB "
          f"(process peak with imports {rss['process_peak_mb']:.0f} MB); dense test codes alone would be {dense_codes_mb:.0f} MB")


# --- the training stage: streaming keeps its memory within train.feed_memory -----------------------------------------

FEED_PARAMS = {
    "seed": 0,
    "data": {"source": "synthetic", "n": 200_000, "d": 512, "families": 4, "values": 8, "n_pairs": 100, "split": [0.9, 0.05, 0.05]},
    "train": {"batch_size": 512, "epochs": 1, "max_steps": 60, "lr": 0.001, "val_samples": 2000, "init_samples": 2000, "shuffle_rows": 4096},
    "sweep": {"rotation": {"methods": ["identity"], "ks": [8]}, "sae": {"methods": ["topk"], "dict_sizes": [64], "ks": [8]}},
    "methods": {"identity": {}, "topk": {}},
    "evaluate": {"ks": [8]},
}
#: 180,000 training rows of 512 float32 values: 352 MiB; the budget below holds an eighth of that
FEED_BUDGET_MB, SPLIT_MB = 48, 180_000 * 512 * 4 / 2**20

TRAIN_CHILD = """
import ctypes, json, sys
from pathlib import Path
import yaml
from pipeline.config import validate_params
from pipeline.paths import Layout
from pipeline.training.cell_training import train_cell
import torch._dynamo  # noqa: F401  imported before the measurement starts (the first optimiser would)
root, train = Path(sys.argv[1]), json.loads(sys.argv[2])
raw = yaml.safe_load((root / "params.yaml").read_text()); raw["train"].update(train)
params = validate_params(raw); layout = Layout(root); cell = params.cells()[-1]
def status_mb(key):
    return int(next(line for line in open("/proc/self/status") if line.startswith(key)).split()[1]) / 1024
ctypes.CDLL("libc.so.6").malloc_trim(0)
open("/proc/self/clear_refs", "w").write("5")
start = status_mb("VmHWM")
train_cell(params, layout, cell)
timings = json.loads(layout.model_timings(cell.name).read_text())
print(json.dumps({"start_mb": start, "peak_mb": status_mb("VmHWM"), "feed": timings["feed"]}))
"""


@pytest.fixture(scope="module")
def feed_project(tmp_path_factory) -> Path:
    from stages import data, extract

    root = tmp_path_factory.mktemp("feed_memory")
    (root / "params.yaml").write_text(yaml.safe_dump(FEED_PARAMS, sort_keys=False))
    params = validate_params(FEED_PARAMS)
    data.run(params, Layout(root))
    extract.run(params, Layout(root))
    return root


def train_rss(root: Path, **train) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", TRAIN_CHILD, str(root), json.dumps(train)], env=env, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_budget_smaller_than_the_split_streams_it_and_bounds_the_training_stages_peak_rss(feed_project):
    streaming = train_rss(feed_project, feed_memory=f"{FEED_BUDGET_MB}MiB")
    growth = streaming["peak_mb"] - streaming["start_mb"]
    from pipeline.training.feed import CHUNKS_PER_READ

    samples_mb = 2 * 2000 * 512 * 4 / 2**20  # the validation and initialisation samples, read whatever the mode
    # reading them: 2 ranges a thread in flight, each its rows and the bytes zarr read (2 MiB chunks)
    reading_mb = 2 * (os.cpu_count() or 1) * CHUNKS_PER_READ * 2 * 2
    bound = FEED_BUDGET_MB + samples_mb + reading_mb + 80  # + the model, its optimiser, first-use buffers of torch, allocator slack
    assert streaming["feed"] == "streaming"
    assert bound < SPLIT_MB / 2, "the bound must catch a split held in memory"
    assert growth <= bound, f"streaming grew the RSS by {growth:.0f} MB > {bound:.0f} MB (budget {FEED_BUDGET_MB} MiB)"
    resident = train_rss(feed_project, feed_memory="1GiB")
    assert resident["feed"] == "resident" and resident["peak_mb"] - resident["start_mb"] >= SPLIT_MB, "the measurement sees the split"
    print(f"training: streaming +{growth:.0f} MB (budget {FEED_BUDGET_MB} MiB, bound {bound:.0f}); resident "
          f"+{resident['peak_mb'] - resident['start_mb']:.0f} MB (split {SPLIT_MB:.0f} MiB)")
