"""The interface every sparse model (CEDAR, rotation baselines, SAEs) implements.

One training loop (`pipeline.training.loop`) and one evaluation drive every model through this
interface, so adding a method means adding a subclass and registering it in
`pipeline.models.registry.METHODS`. Models do no I/O: saving and loading live in
`pipeline.models.checkpoint`.

Conventions
- Inputs `x` are float32 tensors of shape (n, d) in the *original* embedding space.
- Codes are (n, n_latents). SAEs give non-negative codes; CEDAR-like rotations give
  signed codes (`signed = True`), turned into 2*d non-negative half-axis latents by
  `latents()` for matching and naming.
- `progress` in [0, 1] is the fraction of the planned training steps already done; it
  drives curricula (CEDAR's dense-to-sparse k) without the model knowing the loop.
- Options: each class declares its keyword options as a nested `Options` settings dataclass
  (`pipeline.settings`); a subclass's `Options` extends its parent's. `build(method, ..., **options)`
  validates them through it, `model.options` holds the instance, and a checkpoint stores
  `dataclasses.asdict(model.options)`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, ClassVar, TypeVar

import numpy as np
import torch
from scipy import sparse
from torch import Tensor, nn

from pipeline.models.options import NoOptions

F = TypeVar("F", bound=Callable[..., Any])


def array_io(method: F) -> F:
    """Let a model method take and return numpy arrays as well as tensors.

    The first positional argument may be a numpy array (any float dtype): it is converted to a
    float32 tensor on the model's device, the method runs under `torch.no_grad()`, and the
    result comes back as a numpy array. Tensor in, tensor out is unchanged (gradients flow).
    This is what lets notebooks call `model.encode(x_numpy, k)` on the same class the training
    loop drives with tensors.
    """

    @functools.wraps(method)
    def wrapper(self: "SparseModel", x: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(x, Tensor):
            return method(self, x, *args, **kwargs)
        array = np.asarray(x)
        if array.dtype.kind not in "fiu":
            raise TypeError(f"{type(self).__name__}.{method.__name__}: expected a numeric array, got dtype {array.dtype}")
        tensor = next(iter(self.parameters()), None)
        tensor = tensor if tensor is not None else next(iter(self.buffers()), None)
        device = tensor.device if tensor is not None else torch.device("cpu")
        with torch.no_grad():
            out = method(self, torch.as_tensor(array, dtype=torch.float32, device=device), *args, **kwargs)
        return out.detach().cpu().numpy()

    return wrapper  # type: ignore[return-value]


def tensor_csr(codes: Tensor) -> sparse.csr_array:
    """A dense (b, L) tensor of codes on any device as a float32 CSR array on the CPU: the non-zeros are found on
    the device (`torch.nonzero` is row-major, so column indices come out ascending) and only they cross to the host."""
    codes = codes.detach()
    b, n_cols = codes.shape
    where = torch.nonzero(codes)
    values = codes[where[:, 0], where[:, 1]].float().cpu().numpy()
    rows, columns = where[:, 0].cpu().numpy(), where[:, 1].cpu().numpy().astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=b))]).astype(np.int64)
    return sparse.csr_array((values, columns, indptr), shape=(b, n_cols))


def half_axes(codes: sparse.csr_array) -> sparse.csr_array:
    """Signed sparse codes (b, L) as non-negative half-axis latents (b, 2 L): `SparseModel.latents` on CSR (column i
    holds max(c_i, 0), column L + i holds max(-c_i, 0)); indices stay ascending within a row."""
    n_rows, n_cols = codes.shape
    columns = codes.indices.astype(np.int64) + np.where(codes.data < 0, n_cols, 0)
    rows = np.repeat(np.arange(n_rows), np.diff(codes.indptr))
    out = sparse.csr_array((np.abs(codes.data).astype(np.float32), (rows, columns)), shape=(n_rows, 2 * n_cols))
    out.sort_indices()
    return out


class SparseModel(nn.Module):
    """Base class. Subclasses set `method`, `signed`, their `Options`, and implement encode/decode/training_loss."""

    method: ClassVar[str] = ""
    signed: ClassVar[bool] = False
    trainable: ClassVar[bool] = True
    #: whether training may run the forward pass under bfloat16 autocast (`TrainSettings.precision`); the rotation
    #: models say no (their matrix exponential / Cayley map and exact invertibility need float32)
    autocast_safe: ClassVar[bool] = True
    #: training progress at which a curriculum reaches its target (0: the model has none; see CEDAR)
    curriculum_end: float = 0.0
    Options = NoOptions

    def __init__(self, d: int, n_latents: int, k: int, **options: Any) -> None:
        super().__init__()
        if d < 1 or n_latents < 1 or not 1 <= k <= n_latents:
            raise ValueError(f"{self.method}: need d >= 1, n_latents >= 1, 1 <= k <= n_latents; got d={d}, n_latents={n_latents}, k={k}")
        self.d = int(d)
        self.n_latents = int(n_latents)
        self.k = int(k)
        self.options = self.Options(**options)

    # --- the interface -------------------------------------------------------------
    def fit_init(self, x: Tensor) -> None:
        """Data-dependent initialisation from a sample of training inputs (n, d), e.g. the mean."""

    def encode(self, x: Tensor, k: int | None = None) -> Tensor:
        """(n, d) -> (n, n_latents) codes. `k` overrides the sparsity where the method allows it."""
        raise NotImplementedError

    def decode(self, codes: Tensor) -> Tensor:
        """(n, n_latents) -> (n, d) reconstruction in the original space."""
        raise NotImplementedError

    def decode_sparse(self, codes: Tensor) -> Tensor:
        """`decode` of codes (n, n_latents) with few non-zeros per row (as `encode` returns them): the same
        reconstruction (n, d) up to float rounding. Models with a wide dictionary override it to multiply only the
        non-zeros."""
        return self.decode(codes)

    def forward(self, x: Tensor, k: int | None = None) -> Tensor:
        """Reconstruction (n, d) of x through the sparse bottleneck."""
        return self.decode(self.encode(x, k))

    def training_loss(self, x: Tensor, progress: float, generator: torch.Generator) -> tuple[Tensor, dict[str, Tensor]]:
        """Scalar loss for one batch and named detached statistics (must include 'l0')."""
        raise NotImplementedError

    def finish(self, x: Tensor) -> None:
        """Called once after training (the kept epoch restored) with a sample of training inputs (n, d): a
        post-training correction such as the ReLU SAE's `rescale`; default nothing."""

    def before_step(self) -> None:
        """Called after backward, before the optimiser step (e.g. project decoder gradients)."""

    def after_step(self) -> None:
        """Called after the optimiser step (e.g. renormalise decoder columns, update EMAs)."""

    def acceptable(self, val_l0: float) -> bool:
        """Whether an epoch with this validation mean L0 may be kept as the best one. Models whose
        sparsity is steered towards k during training (ReLU/JumpReLU with a target L0) refuse
        epochs that reached a low FVU only by being denser than asked."""
        return True

    # --- shared helpers ------------------------------------------------------------
    def check_input(self, x: Tensor) -> None:
        """Raise a clear error for a wrong shape or non-finite input (called by encode)."""
        if x.ndim != 2 or x.shape[1] != self.d:
            raise ValueError(f"{self.method}: expected input of shape (n, {self.d}), got {tuple(x.shape)}")
        if not torch.isfinite(x).all():
            raise ValueError(f"{self.method}: input contains NaN or infinite values")

    def latents(self, codes: Tensor) -> Tensor:
        """Non-negative latent view (n, n_latents or 2*n_latents) used for matching and naming.

        Signed codes become half-axes: column i is max(c_i, 0) (the +i direction), column
        n_latents + i is max(-c_i, 0) (the -i direction).
        """
        if not self.signed:
            return codes
        return torch.cat([codes.clamp(min=0), (-codes).clamp(min=0)], dim=1)

    @torch.no_grad()
    def sparse_latents(self, x: Tensor | np.ndarray, k: int | None = None, batch_size: int = 4096) -> sparse.csr_array:
        """`latents(encode(x, k))` as a float32 CSR array (n, n_half_latents) on the CPU, encoded in batches on the
        model's device: a k-sparse code never exists densely for more than one batch."""
        tensor = next(iter(self.parameters()), None)
        tensor = tensor if tensor is not None else next(iter(self.buffers()), None)
        device = tensor.device if tensor is not None else torch.device("cpu")
        blocks = []
        for start in range(0, len(x), batch_size):
            xb = torch.as_tensor(np.asarray(x[start : start + batch_size]), dtype=torch.float32, device=device)
            codes = tensor_csr(self.encode(xb, k))
            blocks.append(half_axes(codes) if self.signed else codes)
        if not blocks:
            return sparse.csr_array((0, self.n_half_latents), dtype=np.float32)
        return sparse.csr_array(sparse.vstack(blocks, format="csr"))

    @property
    def n_half_latents(self) -> int:
        """Number of columns of `latents()`."""
        return 2 * self.n_latents if self.signed else self.n_latents
