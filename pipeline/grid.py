"""The sweep grid: its settings (params.yaml `sweep:`) and its cells, one DVC stage each.

Two families of cells: rotations (CEDAR and the rotation baselines: one latent per embedding dimension, so only
k varies) and SAEs (method x dictionary size x k). A cell's `name` is the suffix of its DVC matrix stage
(`rotation@cedar-16`, `sae@topk-256-16`) and the name of its model and evaluation folders.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field

from pipeline.settings import Int, settings


@settings
class RotationSweep:
    """Rotation methods (`pipeline.models.options.ROTATION_METHODS`) x k."""

    methods: tuple[str, ...] = Field(min_length=1)
    ks: tuple[Int, ...] = Field(min_length=1)


@settings
class SAESweep:
    """SAE methods x dictionary sizes x k (every k must fit every size)."""

    methods: tuple[str, ...] = Field(min_length=1)
    dict_sizes: tuple[Int, ...] = Field(min_length=1)
    ks: tuple[Int, ...] = Field(min_length=1)


@settings
class Sweep:
    """The grid. Its values are checked against each other and the embedding dimension by `pipeline.config`."""

    rotation: RotationSweep
    sae: SAESweep


@dataclass(frozen=True)
class Cell:
    """One grid cell: a method, its latent count (`size`: the dictionary size, or d for a rotation) and k."""

    method: str
    size: int
    k: int
    rotation: bool

    @property
    def name(self) -> str:
        return f"{self.method}-{self.k}" if self.rotation else f"{self.method}-{self.size}-{self.k}"


def cells(sweep: Sweep, d: int | None) -> list[Cell]:
    """Every cell of the grid, in params order: rotations first (size = d, 0 when unknown), then SAEs."""
    rotations = [Cell(m, d or 0, k, rotation=True) for m in sweep.rotation.methods for k in sweep.rotation.ks]
    saes = [Cell(m, s, k, rotation=False) for m in sweep.sae.methods for s in sweep.sae.dict_sizes for k in sweep.sae.ks]
    return rotations + saes
