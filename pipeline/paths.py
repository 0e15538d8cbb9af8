"""Every file and folder name passed between stages, relative to the project root (mirrors dvc.yaml's deps/outs).

A stage takes a `Layout` (tests use a scratch root) and never spells a path itself; a test checks that dvc.yaml
names the same paths. Inside a folder that one library module owns (the dataset, a checkpoint, the caption
decoder), that module names its own files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Layout:
    """The store layout under a project root."""

    root: Path = Path(".")

    @property
    def params(self) -> Path:
        return self.root / "params.yaml"

    @property
    def store(self) -> Path:
        return self.root / "store"

    # --- data stage: the dataset (`pipeline.data.dataset` names the files inside) -------------------
    @property
    def data(self) -> Path:
        return self.store / "data"

    @property
    def bad_images(self) -> Path:  # images the data stage skipped, with the reason
        return self.data / "bad_images.json"

    @property
    def data_embeddings(self) -> Path:  # a source's own embeddings (synthetic source), linked into `embeddings` by extract
        return self.data / "embeddings"

    # --- encoder stage ---------------------------------------------------------------------------
    @property
    def encoder(self) -> Path:  # the embedded model, or a pretrained encoder's spec.json
        return self.store / "encoder"

    @property
    def metrics(self) -> Path:  # folder of the stage-level metrics files
        return self.store / "metrics"

    @property
    def encoder_metrics(self) -> Path:
        return self.metrics / "encoder.json"

    # --- extract stage -----------------------------------------------------------------------------
    @property
    def embeddings(self) -> Path:
        return self.store / "embeddings"

    @property
    def image_embeddings(self) -> Path:  # (n, d): one row per dataset image
        return self.embeddings / "images.zarr"

    @property
    def caption_embeddings(self) -> Path:  # (n, d): one row per dataset image (encoders with a text tower)
        return self.embeddings / "captions.zarr"

    @property
    def concept_embeddings(self) -> Path:  # (V, d): the concept vocabulary (encoders with a text tower)
        return self.embeddings / "concepts.zarr"

    def pair_embeddings(self, side: str) -> Path:  # (p, d): "before" or "after" images of the intervention pairs
        if side not in ("before", "after"):
            raise ValueError(f"side: expected 'before' or 'after', got {side!r}")
        return self.embeddings / f"pairs_{side}.zarr"

    # --- captions stage ----------------------------------------------------------------------------
    @property
    def captions(self) -> Path:  # the caption decoder (`pipeline.explain.decoder` names the files)
        return self.store / "captions"

    @property
    def captions_history(self) -> Path:
        return self.captions / "history.json"

    # --- probes stage: the linear probes of every kind, fitted once per dataset (`pipeline.scoring.probe_files`) ---
    @property
    def probes(self) -> Path:
        return self.store / "probes"

    # --- grid-cell stages: one folder per run ------------------------------------------------------
    @property
    def models(self) -> Path:
        return self.store / "models"

    def model(self, run: str) -> Path:  # the checkpoint (`pipeline.models.checkpoint` names the files)
        return self.models / run

    def model_history(self, run: str) -> Path:  # per-epoch training history
        return self.model(run) / "history.json"

    def model_timings(self, run: str) -> Path:  # wall-clock seconds of the last training (not a DVC output: they vary)
        return self.models / f"{run}.timings.json"

    def model_work(self, run: str) -> Path:  # epoch checkpoints of an unfinished training (resumed after a kill)
        return self.models / f"{run}.tmp"

    def codes(self, run: str) -> Path:  # the run's sparse codes of the evaluation rows (`pipeline.scoring.codes`);
        return self.models / f"{run}.codes"  # beside the model, outside its DVC-cached folder (large, and re-derivable)

    @property
    def evals(self) -> Path:
        return self.store / "eval"

    def evaluation(self, run: str) -> Path:
        return self.evals / run

    def run_metrics(self, run: str) -> Path:
        return self.evaluation(run) / "metrics.json"

    def run_curve(self, run: str) -> Path:  # FVU against K (DVC plots)
        return self.evaluation(run) / "fvu_curve.json"

    def run_explanations(self, run: str) -> Path:
        return self.evaluation(run) / "explain.json"

    @property
    def timings(self) -> Path:  # folder of the evaluations' wall-clock seconds per part (not in store/eval: they
        return self.store / "timings"  # differ from run to run, and the report reads store/eval)

    def run_timings(self, run: str) -> Path:
        return self.timings / f"{run}.json"

    # --- planted and report stages -----------------------------------------------------------------
    @property
    def planted_metrics(self) -> Path:
        return self.metrics / "planted.json"

    @property
    def report(self) -> Path:
        return self.root / "reports" / "index.html"
