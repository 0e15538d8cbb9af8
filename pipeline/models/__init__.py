"""Sparse models behind one interface (`SparseModel`) and the registry that builds them by name.

`build(method, d, dict_size, k, seed, **options)` is the only constructor the stages use;
options come from the method's section of params.yaml (validated by `pipeline.config`).
Rotation-family methods (CEDAR and its baselines) have n_latents = d and ignore dict_size.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from pipeline.models.base import SparseModel

#: method name -> "module:Class". Imported lazily so that `import pipeline.models` stays cheap.
METHODS: dict[str, str] = {
    # rotations of the embedding space (n_latents = d, signed codes)
    "cedar": "pipeline.models.cedar:Cedar",
    "identity": "pipeline.models.rotations:IdentityBasis",
    "pca": "pipeline.models.rotations:PCABasis",
    "ica": "pipeline.models.rotations:ICABasis",
    "random_rotation": "pipeline.models.rotations:RandomRotation",
    # sparse autoencoders (n_latents = dictionary size, non-negative codes)
    "relu": "pipeline.models.sae:ReLUSAE",
    "topk": "pipeline.models.sae:TopKSAE",
    "batchtopk": "pipeline.models.sae:BatchTopKSAE",
    "jumprelu": "pipeline.models.sae:JumpReLUSAE",
    "matryoshka": "pipeline.models.sae:MatryoshkaSAE",
    "matryoshka_prefix": "pipeline.models.sae:PrefixMatryoshkaSAE",
}

#: methods whose latent count is the embedding dimension (a rotation of the space).
ROTATION_METHODS: frozenset[str] = frozenset({"cedar", "identity", "pca", "ica", "random_rotation"})


def model_class(method: str) -> type[SparseModel]:
    """The class registered for `method`; a clear error for an unknown name."""
    if method not in METHODS:
        raise KeyError(f"unknown method {method!r}; known methods: {', '.join(sorted(METHODS))}")
    module_name, class_name = METHODS[method].split(":")
    return getattr(importlib.import_module(module_name), class_name)


def build(method: str, d: int, dict_size: int, k: int, seed: int = 0, **options: Any) -> SparseModel:
    """A freshly initialised model; the same (method, sizes, seed) always gives the same weights."""
    cls = model_class(method)
    n_latents = d if method in ROTATION_METHODS else dict_size
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return cls(d=d, n_latents=n_latents, k=k, **options)
