"""Where every stage reads and writes, relative to the project root (mirrors dvc.yaml's deps/outs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Layout:
    """The store layout under a project root. Stages take a Layout so tests can use a scratch root."""

    root: Path = Path(".")

    @property
    def data(self) -> Path:  # scenes stage: images, labels, captions, pairs
        return self.root / "store" / "data"

    @property
    def encoder(self) -> Path:  # encoder stage: the embedded model
        return self.root / "store" / "encoder"

    @property
    def encoder_metrics(self) -> Path:
        return self.root / "store" / "metrics" / "encoder.json"

    @property
    def planted_metrics(self) -> Path:  # planted stage: recovery benchmark
        return self.root / "store" / "metrics" / "planted.json"

    @property
    def embeddings(self) -> Path:  # extract stage
        return self.root / "store" / "embeddings"

    @property
    def captions(self) -> Path:  # captions stage: the embedded caption decoder
        return self.root / "store" / "captions"

    @property
    def models(self) -> Path:  # train stages: one directory per run
        return self.root / "store" / "models"

    @property
    def evals(self) -> Path:  # evaluate stages: one directory per run
        return self.root / "store" / "eval"

    @property
    def report(self) -> Path:
        return self.root / "reports" / "index.html"

    @property
    def params(self) -> Path:
        return self.root / "params.yaml"
