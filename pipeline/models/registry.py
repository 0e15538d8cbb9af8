"""The model classes by method name, and the one constructor the stages use.

`build(method, d, dict_size, k, seed, **options)` builds a freshly initialised model; options come from the
method's section of params.yaml and are validated by the class's `Options` (`pipeline.models.options`, which also
says which methods are rotations). Rotation-family methods (CEDAR and its baselines) have n_latents = d and ignore
dict_size.
"""

from __future__ import annotations

from typing import Any

import torch

from pipeline.models.base import SparseModel
from pipeline.models.cedar import Cedar
from pipeline.models.options import ROTATION_METHODS, options_class
from pipeline.models.penalty import JumpReLUSAE, ReLUSAE
from pipeline.models.rotations import ICABasis, IdentityBasis, PCABasis, RandomRotation
from pipeline.models.topk import BatchTopKSAE, MatryoshkaSAE, PrefixMatryoshkaSAE, TopKSAE

#: method name -> model class (the names of `pipeline.models.options.OPTIONS`, each class's `Options` that entry)
METHODS: dict[str, type[SparseModel]] = {cls.method: cls for cls in (
    Cedar, IdentityBasis, PCABasis, ICABasis, RandomRotation,  # rotations of the embedding space (n_latents = d, signed)
    ReLUSAE, TopKSAE, BatchTopKSAE, JumpReLUSAE, MatryoshkaSAE, PrefixMatryoshkaSAE,  # SAEs (non-negative codes)
)}


def model_class(method: str) -> type[SparseModel]:
    """The class registered for `method`; a clear error for an unknown name."""
    options_class(method)  # the one list of names
    return METHODS[method]


def build(method: str, d: int, dict_size: int, k: int, seed: int = 0, **options: Any) -> SparseModel:
    """A freshly initialised model; the same (method, sizes, seed) always gives the same weights."""
    cls = model_class(method)
    n_latents = d if method in ROTATION_METHODS else dict_size
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return cls(d=d, n_latents=n_latents, k=k, **options)
