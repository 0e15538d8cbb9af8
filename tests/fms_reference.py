"""Two references for pipeline.metrics.fms, for tests only.

- `sklearn_fms`: FMS through scikit-learn's `DecisionTreeClassifier` (the implementation this project used before
  the trees moved to torch): a deep tree per concept and a chain of stumps refitted on codes with the root latents
  zeroed. scikit-learn breaks ties between latents by a random visiting order (`random_state`).
- `tree_levels` / `stump_chain`: a slow, plain numpy greedy Gini tree with the tie rule of pipeline.metrics.fms
  (lowest latent, then lowest threshold), written independently of it, for cases where ties decide the tree.

Both take every row of a concept (no subsampling): call the metric with balanced=False and max_n >= n.
"""

from __future__ import annotations

import numpy as np
import sklearn
from sklearn.tree import DecisionTreeClassifier

SAME = 1e-7  # scikit-learn's FEATURE_THRESHOLD


# --- scikit-learn ---------------------------------------------------------------------------------------------------


def _truncated_accuracies(clf: DecisionTreeClassifier) -> np.ndarray:
    """In-sample accuracy of a fitted tree cut after depth 1 .. D (a leaf-only tree: the majority rate, once)."""
    tree = clf.tree_
    left, right = tree.children_left, tree.children_right
    depth = np.zeros(left.size, dtype=np.int64)
    frontier, level = np.array([0]), 0
    while frontier.size:
        kids = np.concatenate([left[frontier], right[frontier]])
        kids = kids[kids >= 0]
        level += 1
        depth[kids] = level
        frontier = kids
    is_leaf = left < 0
    counts = tree.weighted_n_node_samples[:, None] * tree.value[:, 0, :]
    correct = np.rint(counts.max(axis=1))
    levels = np.arange(1, max(int(depth.max()), 1) + 1)
    frontier = (depth[None, :] == levels[:, None]) | (is_leaf[None, :] & (depth[None, :] < levels[:, None]))
    return (frontier @ correct) / tree.weighted_n_node_samples[0]


def _fit(x: np.ndarray, y: np.ndarray, random_state: int, max_depth: int | None) -> DecisionTreeClassifier:
    with sklearn.config_context(assume_finite=True):
        return DecisionTreeClassifier(criterion="gini", max_depth=max_depth, random_state=random_state).fit(x, y)


def sklearn_fms(codes: np.ndarray, y: np.ndarray, removals: tuple[int, ...], levels: str, exhausted: str,
                random_state: int = 0) -> dict[str, float] | None:
    """One concept's FMS terms on every row of dense `codes` (n, L) with labels y (n,) bool; None if the codes
    cannot split it. Keys: fms, acc0, local, global, depth, root, cuts (accuracy after 0..max(removals) removals,
    NaN = exhausted under "drop")."""
    x = codes.astype(np.float32)
    clf = _fit(x, y, random_state, None)
    if clf.tree_.children_left[0] < 0:
        return None
    acc = _truncated_accuracies(clf)
    acc0 = float(acc[0])
    deeper = acc[1:]
    majority = max(y.mean(), 1.0 - y.mean())
    if levels == "published":
        deeper = np.concatenate([[majority], deeper])
    global_ = 1.0 - float(np.mean(deeper - acc0)) if deeper.size else 1.0
    cuts = np.full(max(removals) + 1, np.nan)
    cuts[0] = acc0
    work = x.copy()
    removed = int(clf.tree_.feature[0])
    for p in range(1, max(removals) + 1):
        work[:, removed] = 0.0
        stump = _fit(work, y, random_state, 1)
        if stump.tree_.children_left[0] < 0:  # nothing left to split: this and every later count
            cuts[p:] = np.nan if exhausted == "drop" else majority
            break
        cuts[p] = float(_truncated_accuracies(stump)[0])
        removed = int(stump.tree_.feature[0])
    terms = np.array([2.0 * (acc0 - cuts[p]) for p in removals])
    local = float(np.nanmean(terms)) if (~np.isnan(terms)).any() else np.nan
    return {"fms": acc0 * (local + global_) / 2.0, "acc0": acc0, "local": local, "global": global_, "depth": clf.get_depth(),
            "root": int(clf.tree_.feature[0]), "cuts": cuts}


# --- plain numpy, the tie rule of pipeline.metrics.fms ------------------------------------------------------------------


def best_split(x: np.ndarray, y: np.ndarray, skip: set[int] = frozenset()) -> tuple[float, int, float, np.ndarray] | None:
    """(scikit-learn's Gini proxy, latent, threshold value, left mask) of the best split of rows x (m, L) with labels
    y (m,) bool, or None; latents in `skip` are not considered. Ties: the lowest latent, then the lowest threshold."""
    n, pos = y.size, int(y.sum())
    neg = n - pos
    best = None
    for latent in range(x.shape[1]):
        if latent in skip:
            continue
        values = x[:, latent].astype(np.float64)
        order = np.argsort(values, kind="stable")
        v, cum = values[order], np.cumsum(y[order])
        for i in range(n - 1):
            if v[i + 1] <= v[i] + SAME:
                continue
            lp, ln = int(cum[i]), i + 1 - int(cum[i])
            rp, rn = pos - lp, neg - ln
            nl, nr = lp + ln, rp + rn
            proxy = -nr * (1.0 - (rn * rn + rp * rp) / (nr * nr)) - nl * (1.0 - (ln * ln + lp * lp) / (nl * nl))
            if best is None or proxy > best[0]:
                best = (proxy, latent, v[i], values <= v[i])
    return best


def tree_levels(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, int]:
    """Accuracies of the greedy Gini tree cut after depth 1 .. D (level by level), and its root latent (-1: none)."""
    majority = lambda rows: max(int(y[rows].sum()), rows.size - int(y[rows].sum()))  # noqa: E731
    nodes, correct, levels, root = [np.arange(y.size)], majority(np.arange(y.size)), [], -1
    while True:
        children = []
        for rows in nodes:
            if y[rows].all() or not y[rows].any():
                continue
            split = best_split(x[rows], y[rows])
            if split is None:
                continue
            if not levels and root < 0:
                root = split[1]
            left, right = rows[split[3]], rows[~split[3]]
            correct += majority(left) + majority(right) - majority(rows)
            children += [left, right]
        if not children:
            return np.array(levels), root
        levels.append(correct / y.size)
        nodes = children


def stump_chain(x: np.ndarray, y: np.ndarray, n_chain: int) -> np.ndarray:
    """Root-split accuracy after 0, 1, ... n_chain - 1 removals (each removal: the last root latent can no longer
    split), NaN once no latent can."""
    out, skip = np.full(n_chain, np.nan), set()
    for p in range(n_chain):
        split = best_split(x, y, skip)
        if split is None:
            break
        left = split[3]
        out[p] = (max(int(y[left].sum()), int((~y[left]).sum())) + max(int(y[~left].sum()), int((~y[~left]).sum()))) / y.size
        skip.add(split[1])
    return out
