"""Sparse models behind one interface (`SparseModel`) and the registry that builds them by name.

`build(method, d, dict_size, k, seed, **options)` is the only constructor the stages use;
options come from the method's section of params.yaml and are validated by the class's `Options`.
Rotation-family methods (CEDAR and its baselines) have n_latents = d and ignore dict_size.
"""

from __future__ import annotations

from typing import Any

import torch

from pipeline.models.base import SparseModel
from pipeline.models.cedar import Cedar
from pipeline.models.penalty import JumpReLUSAE, ReLUSAE
from pipeline.models.rotations import ICABasis, IdentityBasis, PCABasis, RandomRotation
from pipeline.models.topk import BatchTopKSAE, MatryoshkaSAE, PrefixMatryoshkaSAE, TopKSAE

#: method name -> model class
METHODS: dict[str, type[SparseModel]] = {
    # rotations of the embedding space (n_latents = d, signed codes)
    "cedar": Cedar,
    "identity": IdentityBasis,
    "pca": PCABasis,
    "ica": ICABasis,
    "random_rotation": RandomRotation,
    # sparse autoencoders (n_latents = dictionary size, non-negative codes)
    "relu": ReLUSAE,
    "topk": TopKSAE,
    "batchtopk": BatchTopKSAE,
    "jumprelu": JumpReLUSAE,
    "matryoshka": MatryoshkaSAE,
    "matryoshka_prefix": PrefixMatryoshkaSAE,
}

#: methods whose latent count is the embedding dimension (a rotation of the space).
ROTATION_METHODS: frozenset[str] = frozenset({"cedar", "identity", "pca", "ica", "random_rotation"})


def model_class(method: str) -> type[SparseModel]:
    """The class registered for `method`; a clear error for an unknown name."""
    if method not in METHODS:
        raise KeyError(f"unknown method {method!r}; known methods: {', '.join(sorted(METHODS))}")
    return METHODS[method]


def build(method: str, d: int, dict_size: int, k: int, seed: int = 0, **options: Any) -> SparseModel:
    """A freshly initialised model; the same (method, sizes, seed) always gives the same weights."""
    cls = model_class(method)
    n_latents = d if method in ROTATION_METHODS else dict_size
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return cls(d=d, n_latents=n_latents, k=k, **options)
