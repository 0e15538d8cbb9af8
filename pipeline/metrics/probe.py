"""Linear probe (LP) metric: does a reconstruction keep what a classifier on the originals uses?

docs/science.md §3: a multinomial logistic regression is trained on the dense embeddings for the dataset's
classes; we report its cross-entropy on the originals and on the reconstructions (natural log,
mean over test rows), the mean KL(p_original || p_reconstruction), and both accuracies.
No feature scaling is applied: the probe sees the embeddings exactly as the sparse models
reconstruct them, so a reconstruction is judged in the space it was trained to reproduce.

The probes of several attribute families (one classification each) are one model with a head per family, fitted at
once with torch on the data's device, full batch, by L-BFGS (scipy's L-BFGS-B driving torch's products, the solver
scikit-learn uses). The objective is scikit-learn's `LogisticRegression(C=c)` for each family, summed over families
(the families do not interact, so the joint optimum is every family's own): mean cross-entropy + ||W_f||^2 / (2 c n),
intercepts not penalised, a multinomial (softmax) head per family; a family with two classes is scikit-learn's single
logistic vector, which is a two-class softmax head with its penalty doubled (the same probabilities at the optimum).
scikit-learn stays the reference in tests/test_metrics_probe.py (scores within 5e-3 of it).

Solver details, ours: the intercepts absorb the features' mean, and the optimisation runs in preconditioned
coordinates W = P V with P = (S / 4 + I / (c n))^(-1/2), S the features' covariance (one d x d eigendecomposition):
the same optimum, reached in far fewer iterations than on raw embeddings. The gradient is written out (softmax minus
one-hot, no autograd), so one evaluation of the objective costs two (n, d) x (d, K) products (scipy's line search
needs ~1.1 evaluations per iteration, torch's strong-Wolfe search ~1.5). Stops when the largest entry of the gradient
in W's coordinates is at most `tol` (1e-5: tighter than scikit-learn's 1e-4, so that the scores sit within 1e-3 of
scikit-learn run to convergence), when the objective stops changing (relative change below 64 float64 epsilons, as
scikit-learn), or after `max_iter` iterations. The products run in float32 (`dtype`); the objective is summed and
the weights returned in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import minimize

#: names the fitting procedure in the fingerprint of stored probe scores (a new solver invalidates them)
SOLVER = "scipy-lbfgsb-preconditioned"


@dataclass
class ProbeResult:
    """Probe scores of one family on one test set. ce_* in nats; kl = mean KL(p_original || p_reconstruction);
    n: the rows scored (those whose class the probe saw when fitted); the means are NaN when n = 0."""

    ce_original: float
    ce_reconstruction: float
    kl: float
    accuracy_original: float
    accuracy_reconstruction: float
    n: int = 0


@dataclass(frozen=True)
class Probes:
    """Fitted probes of F families (`fit_probes`). classes: per family, the int labels seen when fitting
    (ascending); its head's j-th output is classes[f][j]. weight: float64 (d, K) and bias (K,) on the fitting device,
    K = the summed number of classes; columns: int64 (F, K_max) the column of each family's j-th class, real: bool
    (F, K_max) which of those exist (heads are padded to the largest). iterations: L-BFGS iterations used."""

    classes: tuple[np.ndarray, ...]
    weight: torch.Tensor
    bias: torch.Tensor
    columns: torch.Tensor
    real: torch.Tensor
    iterations: int

    @property
    def n_families(self) -> int:
        return len(self.classes)

    def log_proba(self, x: torch.Tensor) -> torch.Tensor:
        """float64 (n, F, K_max): every family's log-probabilities of its classes (-inf in the padding)."""
        logits = (x @ self.weight + self.bias)[:, self.columns]
        return torch.log_softmax(logits.masked_fill(~self.real, -torch.inf), dim=2)


def _check_x(name: str, x: np.ndarray) -> None:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a numpy array, got {type(x).__name__}")
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name}: expected a non-empty 2-D array (n, d), got shape {x.shape}")
    if x.dtype.kind not in "fiu":
        raise TypeError(f"{name}: expected a numeric array, got dtype {x.dtype}")
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        raise ValueError(f"{name}: contains NaN or infinite values")


def _check_labels(name: str, labels: np.ndarray, n: int) -> np.ndarray:
    """(n, F) int labels ((n,) is one family)."""
    if not isinstance(labels, np.ndarray):
        raise TypeError(f"{name}: expected a numpy array, got {type(labels).__name__}")
    if labels.dtype.kind not in "iub":
        raise TypeError(f"{name}: expected integer class labels, got dtype {labels.dtype}")
    labels = labels[:, None] if labels.ndim == 1 else labels
    if labels.ndim != 2 or labels.shape[0] != n or labels.shape[1] == 0:
        raise ValueError(f"{name}: expected shape ({n},) or ({n}, n_families) matching the rows of x, got {labels.shape}")
    return labels.astype(np.int64)


def _heads(classes: list[np.ndarray], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    sizes = [c.size for c in classes]
    widest = max(sizes)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    j = np.arange(widest)
    real = j[None, :] < np.array(sizes)[:, None]
    columns = np.where(real, starts[:, None] + j[None, :], 0)
    return torch.as_tensor(columns, device=device), torch.as_tensor(real, device=device)


def fit_probes(x: np.ndarray, labels: np.ndarray, c: float = 1.0, max_iter: int = 1000, tol: float = 1e-5,
               device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> Probes:
    """Fit one multinomial logistic probe per family on (n, d) embeddings (module docstring: objective and solver).

    labels: (n, F) int, family f's class of each row ((n,): one family); every family needs at least two distinct
    classes. c: inverse L2 strength (scikit-learn's C). max_iter: L-BFGS iterations at most. tol: stop once every
    entry of the objective's gradient (in W's coordinates, scikit-learn's scale) is at most this (scikit-learn stops
    at 1e-4). device: where the products run (a torch device or its name); dtype: their float type.
    """
    _check_x("x", x)
    labels = _check_labels("labels", labels, x.shape[0])
    if not c > 0:
        raise ValueError(f"c: expected a positive inverse regularisation strength, got {c!r}")
    if not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
        raise ValueError(f"max_iter: expected a positive int, got {max_iter!r}")
    classes = [np.unique(labels[:, f]) for f in range(labels.shape[1])]
    for f, seen in enumerate(classes):
        if seen.size < 2:
            raise ValueError(f"labels: family {f} has {seen.size} distinct class on the rows given; expected at least 2 distinct classes")
    device = torch.device(device)
    n, d = x.shape
    columns, real = _heads(classes, device)
    n_families, widest = real.shape
    k = int(real.sum())
    targets = torch.as_tensor(np.stack([np.searchsorted(classes[f], labels[:, f]) for f in range(len(classes))], axis=1), device=device)
    strength = torch.as_tensor(np.concatenate([np.full(s.size, (2.0 if s.size == 2 else 1.0) / (2.0 * c * n)) for s in classes]),
                               dtype=dtype, device=device)  # per column: 1 / (2 c n), doubled for a two-class family

    features = torch.as_tensor(x, device=device).to(dtype)
    mean = features.to(torch.float64).mean(dim=0)
    centred = features - mean.to(dtype)
    covariance = (centred.T @ centred).to(torch.float64) / (4.0 * n)
    values, vectors = torch.linalg.eigh(covariance + torch.eye(d, dtype=torch.float64, device=device) / (c * n))
    values = values.clamp(min=1e-12)
    precondition = ((vectors * values.rsqrt()) @ vectors.T).to(dtype)  # P = M^(-1/2), symmetric (d, d)
    unprecondition = ((vectors * values.sqrt()) @ vectors.T).to(dtype)  # P^-1: a gradient in V's coordinates back to W's
    metric = ((vectors / values) @ vectors.T).to(dtype)  # P P = M^-1: the penalty |P v|^2 is v' M^-1 v
    z = centred @ precondition
    del features, centred
    padded = bool((~real).any())
    flat = torch.nonzero(real.flatten()).squeeze(1)  # the real columns in (family, class) order = column order
    mask = torch.where(real, 0.0, -torch.inf).to(dtype)
    target = targets[:, :, None]
    last: dict[str, torch.Tensor] = {}

    def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
        t = torch.as_tensor(theta, device=device).to(dtype)
        v, b = t[: d * k].view(d, k), t[d * k :]
        logits = torch.addmm(b, z, v)
        logits = (logits[:, columns] + mask) if padded else logits.view(n, n_families, widest)
        logits = logits - logits.amax(dim=2, keepdim=True)
        p = logits.exp()
        total = p.sum(dim=2, keepdim=True)
        cross_entropy = (total.log() - logits.gather(2, target)).sum(dtype=torch.float64) / n
        p.div_(total).scatter_add_(2, target, torch.full_like(target, -1.0, dtype=dtype)).div_(n)  # (softmax - one-hot) / n
        residual = p.view(n, -1)[:, flat] if padded else p.view(n, k)
        penalised = metric @ v
        loss = cross_entropy + (strength * v * penalised).sum(dtype=torch.float64)
        gradient_v = torch.addmm(2.0 * strength * penalised, z.T, residual)
        gradient_b = residual.sum(dim=0)
        last["w"] = torch.cat([(unprecondition @ gradient_v).flatten(), gradient_b]).abs().max()
        return float(loss), torch.cat([gradient_v.flatten(), gradient_b]).to(torch.float64).cpu().numpy()

    def converged(intermediate_result: object) -> None:
        if float(last["w"]) <= tol:
            raise StopIteration

    result = minimize(objective, np.zeros(d * k + k), jac=True, method="L-BFGS-B", callback=converged,
                      options={"maxiter": int(max_iter), "maxcor": 10, "gtol": 0.0, "ftol": 64 * np.finfo(np.float64).eps, "maxls": 50})
    theta = torch.as_tensor(result.x, dtype=torch.float64, device=device)
    weight = precondition.to(torch.float64) @ theta[: d * k].view(d, k)
    bias = theta[d * k :] - mean @ weight
    return Probes(classes=tuple(classes), weight=weight, bias=bias, columns=columns, real=real, iterations=int(result.nit))


def probe_scores(probes: Probes, x: np.ndarray, x_hat: np.ndarray, labels: np.ndarray) -> list[ProbeResult]:
    """Every family's probe scores on originals x and reconstructions x_hat, both (n, d); labels: (n, F) int
    ((n,): one family). A row whose class a family's probe never saw is left out of that family's scores (the probe
    has no output for it). Computed on the probes' device in float64."""
    if not isinstance(probes, Probes):
        raise TypeError(f"probes: expected fitted Probes (call fit_probes first), got {type(probes).__name__}")
    _check_x("x", x)
    _check_x("x_hat", x_hat)
    if x_hat.shape != x.shape:
        raise ValueError(f"x_hat: expected the shape of x {x.shape}, got {x_hat.shape}")
    labels = _check_labels("labels", labels, x.shape[0])
    if labels.shape[1] != probes.n_families:
        raise ValueError(f"labels: expected {probes.n_families} families (columns), got {labels.shape[1]}")
    device = probes.weight.device
    index = np.zeros(labels.shape, dtype=np.int64)
    seen = np.zeros(labels.shape, dtype=bool)
    for f, classes in enumerate(probes.classes):
        at = np.minimum(np.searchsorted(classes, labels[:, f]), classes.size - 1)
        index[:, f], seen[:, f] = at, classes[at] == labels[:, f]
    index_t, seen_t = torch.as_tensor(index, device=device), torch.as_tensor(seen, device=device)
    with torch.no_grad():
        log_p = probes.log_proba(torch.as_tensor(x, dtype=torch.float64, device=device))
        log_q = probes.log_proba(torch.as_tensor(x_hat, dtype=torch.float64, device=device))
        p = log_p.exp()
        # 0 * log(0 / q) = 0: classes whose probability underflowed to 0 (and the padding) add nothing
        kl = torch.where(p > 0, p * (log_p - log_q), 0.0).sum(dim=2)
        picked = index_t[:, :, None]
        ce_p, ce_q = -log_p.gather(2, picked)[:, :, 0], -log_q.gather(2, picked)[:, :, 0]
        hit_p = (log_p.argmax(dim=2) == index_t).to(torch.float64)  # ties go to the first class, as scikit-learn's
        hit_q = (log_q.argmax(dim=2) == index_t).to(torch.float64)
        weight = seen_t.to(torch.float64)
        count = weight.sum(dim=0)
        sums = torch.stack([(v * weight).sum(dim=0) for v in (ce_p, ce_q, kl, hit_p, hit_q)], dim=1).cpu().numpy()
        count = count.cpu().numpy()
    out = []
    for f in range(probes.n_families):
        means = sums[f] / count[f] if count[f] else np.full(5, np.nan)
        out.append(ProbeResult(*(float(m) for m in means), n=int(count[f])))
    return out
