"""Feature Monosemanticity Score (FMS), Härle et al. 2025, "Measuring and guiding monosemanticity".

Per binary concept c:

- A depth-unrestricted decision tree (Gini) is fitted on the codes. `accs_0` = accuracy of the root split alone
  (the tree cut after its first split; each side predicts its majority class): how well the single best latent
  captures the concept (feature capacity).
- Global disentanglement: with `accs_cum_i` the accuracy of the same tree cut after depth i,
  `FMS_global = 1 - mean over the levels L of (accs_cum_i - accs_0)`: deeper levels should add nothing.
- Local disentanglement: remove the root latent and refit; repeat p times (each time removing the newest root
  latent). `accs_p` = root-split accuracy after p removals and `FMS_local@p = 2 (accs_0 - accs_p)`: a
  monosemantic concept falls to chance once its latent is gone (the factor 2 maps a drop from 1 to 0.5 onto 1).
- `FMS@p = accs_0 (FMS_local@p + FMS_global) / 2`, averaged over concepts.

Three conventions differ between the published evaluation code and the paper's formula or our earlier choice; each
is an option, the published code's is the default (`pipeline.scoring.options.EvaluateSettings`, stated in the
report):
- `removals`: the published score averages FMS@p over p = 1..9 removals (`PUBLISHED_REMOVALS`); a single p gives
  the paper's FMS@p (the paper reports p = 1 and p = 5).
- `levels`: "published" averages the global term over every tree level except the root split *including* the
  no-split level (the majority-class accuracy, depth 0), whose term is negative, so FMS_global can exceed 1;
  "paper" uses the levels 2 .. D only (a tree of depth 1 then has FMS_global = 1).
- `exhausted`: once p removals leave no latent that can split the concept's rows, the refitted tree is a single
  leaf. "drop" (published): that count has no root-split accuracy and leaves the mean over `removals` (the
  published tree statistics give such a tree an undefined accuracy, and the mean skips it); a concept with no
  count left is undefined (NaN). "majority" (our earlier choice): the count scores the majority rate. The published
  code also reads the leaf's feature marker (-2) as a latent index and zeroes the second-to-last latent of the
  rows before the next refit; we do not copy that bug (it zeroes a latent that was never a root; within the chain
  it changes no number, since every latent is constant on those rows by then).

How the trees are grown (torch, on `device`, exactly as scikit-learn's `DecisionTreeClassifier(criterion="gini")`
grows them, which this module used until it moved to the device; tests/test_metrics_fms.py keeps scikit-learn as
the reference):
- A split of a node is a latent and a threshold between two consecutive distinct values of it on the node's rows
  (values closer than 1e-7 count as one, as in scikit-learn); the best split maximises scikit-learn's Gini proxy
  (-n_right gini_right - n_left gini_left, the same float64 formula). A node is split while it holds both classes and
  some latent is not constant on its rows; otherwise it is a leaf.
- Ties: scikit-learn visits the latents of each node in a random order and keeps the first best split; we keep
  the best split of the lowest latent index, and within a latent the lowest threshold (as scikit-learn does within
  a latent). Where two latents tie with different rows on each side (frequent in the deep levels of trees that fit
  noise, rare at the root), the two trees differ below that node: on random sparse codes the per-concept scores
  differ by about as much as scikit-learn's own differ between its random states (~0.003 per concept).
- Work is level by level, vectorised over every node of every concept of a block at once, on the non-zero entries
  of the rows only: entries sorted once by (node, latent, value) stay sorted when nodes split (a stable partition
  per level, no re-sort), each (node, latent) group's zeros are one block whose class counts come from the node's
  totals, and the split search is a segmented cumulative sum. A level costs O(non-zeros of the rows still in
  impure nodes); one host sync per level reads the sizes.
- The removal chain needs no refits: zeroing a latent makes it constant and changes no other latent's splits of the
  root, so the stump after p removals is the p-th best latent of the root (latents ranked by their best root split,
  ties by index); every removal count comes from the root level's search, whose first latent is the tree's root
  split (the tree's first level searches nothing more).
- Dense nodes (more entries than half the latents) keep class counts per latent, and skip the groups that cannot beat
  a split the node is known to have (the zero split of its groups most enriched in either class, `_select`): exact
  pruning, which halves the entries searched on noise-fitting trees of dense codes (CEDAR's). A group searched
  exactly keeps its best split as a bound for the next levels, raised each level by `_drift` (what the rows the node
  lost can add to any split of a group they held no value on), and dropped when a lost row held a value on it: on
  the deep, narrow trees that random TopK codes grow, 2.5x fewer entries searched. A latent of one value (random
  codes, binarised codes) has a single split, the zero split, scored exactly from the counts: it is searched only
  when it reaches the known split (CEDAR's random codes: 10.5 s -> 3.3 s).

Choices, documented:
- Accuracies are in-sample (the tree is evaluated on the rows it was fitted on), as published: the score
  measures how the concept is *organised* in the codes, not generalisation.
- Truncated-tree accuracy is computed exactly from the node class counts: every row sits in the node it reaches
  at the cut depth (or in a shallower leaf) and gets that node's majority class.
- Removal = zeroing the latent's column (as published); a zeroed column is constant and can no longer split.
- Local and global terms are not clipped (neither does the published code).
- Class balance (`balanced=True` by default, as the authors' balanced concept sets): per concept every positive
  and as many randomly drawn negatives (at most max_n / 2 of each). The factor 2 in FMS_local presumes balanced
  classes; on imbalanced attributes the majority rate is close to 1 and even a perfect latent would get
  FMS_local near 0. `balanced=False` keeps the data's class ratio (one shared uniform subsample).
- Degenerate concepts get NaN, excluded from the mean, with a warning naming the concept: a single class on its
  rows, or codes that cannot split its rows at all (e.g. all-zero codes), where any number would be an artefact.
- Subsampling: at most `max_n` rows per concept, drawn without replacement with a generator seeded by (seed,
  concept index), so a concept's rows do not depend on the others.
- Memory: concepts are grown together in blocks of at most `block_entries` non-zero entries (their rows' non-zeros
  summed; a concept larger than that is a block of its own), ~150 bytes per entry at the peak of a level.
- Threads: on the CPU the concepts are split into `available_threads()` blocks of about equal entries (a multiple of
  it where `block_entries` needs more: the blocks grow in rounds of one per thread), grown side by side (torch's
  operations release the GIL; a concept's tree does not depend on its block): 1.3x faster on 2 cores than one block
  on torch's 2 intra-op threads. Never a block more than a round: a small third block on 2 threads grew alone after
  the others, all its ~50 levels (0.2 s of a 1.6 s call on random TopK codes).
- Several code sets of the same rows (`fms_of_sets`: a model's codes, its untrained twin's, random codes) grow in
  shared blocks, each block holding as many trees of every set. A level of a block costs a few hundred torch
  operations (~5-8 ms on the CPU, and a host sync on a GPU) whatever it holds, and trees of random TopK codes are ~45
  levels deep, so fewer, fuller blocks save that overhead: the evaluate stage's three sets of a TopK cell, 2 threads,
  7.7 -> 7.1 s (best of four, alternating with one call per set), CEDAR's 11.3 -> 10.0 s. On a GPU (one block at a
  time) the saving is the blocks the sets share: none where each set fills a block of its own (the benchmark cell's
  sets, 3.6 M entries each, are three blocks either way), two of three levels' syncs where the three fit in one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Literal

import numpy as np
import torch
from scipy import sparse

from pipeline.metrics.conventions import PUBLISHED_REMOVALS
from pipeline.metrics.csr import to_csr
from pipeline.metrics.threads import available_threads, thread_map
from pipeline.records import Undefined

logger = logging.getLogger(__name__)


#: scikit-learn's FEATURE_THRESHOLD: sorted values closer than this are one value (no threshold between them)
_SAME_VALUE = 1e-7

#: non-zero entries grown together at most (a block of concepts); ~150 bytes each at the peak of a level
BLOCK_ENTRIES = 1 << 22
#: groups per class whose zero split bounds a dense node's best split from below (`_select`)
_KNOWN_GROUPS = 4
#: (node, latent) cells kept at most: two int32 class counts and a float64 bound each (~3 copies at the peak of a level: ~200 MB)
DENSE_CELLS = 1 << 22


@dataclass
class FMSResult:
    """FMS over concepts. Per-concept arrays are (n_concepts,), NaN for constant-label concepts.

    fms: mean over scored concepts of the per-concept score. per_concept: FMS@p averaged over `removals`.
    root_accuracy: accs_0. local: FMS_local@p averaged over `removals`. global_: FMS_global (per `levels`).
    root_feature: the root latent (-1 if none). depth: depth of the full tree. cut_accuracy: (n_concepts,
    max(removals) + 1) root-split accuracy after 0 .. max(removals) removals (column 0 = accs_0; NaN where the chain
    was exhausted and `exhausted` is "drop"). removals, levels, exhausted: the conventions used. n_rows:
    (n_concepts,) int, rows the trees saw for each concept.
    """

    fms: float
    per_concept: np.ndarray
    root_accuracy: np.ndarray
    local: np.ndarray
    global_: np.ndarray
    root_feature: np.ndarray
    depth: np.ndarray
    cut_accuracy: np.ndarray
    removals: tuple[int, ...]
    levels: str
    n_rows: np.ndarray
    exhausted: str = "drop"


@dataclass
class _Candidates:
    """Every candidate split of one level: (m,) tensors. node, latent: where; left_pos, left_neg: the class counts of
    the rows at or below `threshold` (a value of the latent); proxy: scikit-learn's Gini proxy, -inf where invalid;
    group: the (node, latent) group the candidate belongs to."""

    node: torch.Tensor
    latent: torch.Tensor
    group: torch.Tensor
    left_pos: torch.Tensor
    left_neg: torch.Tensor
    threshold: torch.Tensor
    proxy: torch.Tensor


def _exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    out = torch.cumsum(x, 0)
    return out - x


def _at(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x[index] along dim 0 for an int64 (m,) index: index_select, 3-5x faster than advanced indexing on the CPU (the
    hot paths gather over every entry of a level)."""
    return torch.index_select(x, 0, index)


def _where(mask: torch.Tensor) -> torch.Tensor:
    """int64 (m,): the positions where the bool (n,) `mask` is True (to gather several arrays with `_at`)."""
    return torch.nonzero(mask).squeeze(1)


def _cells(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The True cells of a contiguous bool (B, L) `mask`, int64 (m,) each: flat index row * L + column, row, column
    (one flat nonzero: faster than nonzero's row and column tuple on the CPU)."""
    cell = _where(mask.view(-1))
    row = torch.div(cell, mask.shape[1], rounding_mode="floor")
    return cell, row, cell - row * mask.shape[1]


def _candidates(node: torch.Tensor, latent: torch.Tensor, value: torch.Tensor, positive: torch.Tensor,
                node_pos: torch.Tensor, node_neg: torch.Tensor) -> tuple[_Candidates, int]:
    """Every split of every node over every latent, from the nodes' non-zero entries.

    node, latent: int64 (E,), value: float64 (E,) non-zero, positive: bool (E,) the class of the entry's row; sorted
    by (node, latent, value). node_pos, node_neg: int64 (n_nodes,) class counts of every node (zeros included).
    A (node, latent) group's rows without an entry hold 0: one block between its negative entries (the group's first
    ones, in value order) and its positive ones. Candidates: "rows <= this entry's value" for each entry, and "rows
    <= 0" for each group with zeros. Per-group quantities come from prefix counts read at the groups' bounds (G
    gathers), so that a level's work over its entries is a few passes. Returns the candidates and the number of groups.
    """
    n_entries = node.numel()
    device = node.device
    start = torch.ones(n_entries, dtype=torch.bool, device=device)
    start[1:] = (node[1:] != node[:-1]) | (latent[1:] != latent[:-1])
    group = torch.cumsum(start, 0) - 1
    first = _where(start)
    n_groups = first.numel()
    end = torch.cat([first[1:], torch.tensor([n_entries], device=device)])  # one past each group's last entry
    above = value > 0
    prefix = torch.zeros((2, n_entries + 1), dtype=torch.int64, device=device)  # entries before position i: positive rows, values > 0
    torch.cumsum(positive, 0, out=prefix[0, 1:])
    torch.cumsum(above, 0, out=prefix[1, 1:])
    cpos, cabove = prefix[0], prefix[1]
    size = end - first
    before_pos = _at(cpos, first)  # (G,) entries of positive rows in earlier groups
    entries_pos = _at(cpos, end) - before_pos  # (G,) the group's entries of positive rows
    positives_at = end - (_at(cabove, end) - _at(cabove, first))  # (G,) the group's first positive value (end: none)
    below_pos = _at(cpos, positives_at) - before_pos  # (G,) its negative entries by class
    below_neg = positives_at - first - below_pos
    group_node = _at(node, first)
    zero_pos = _at(node_pos, group_node) - entries_pos  # (G,) the group's rows at 0
    zero_neg = _at(node_neg, group_node) - (size - entries_pos)
    has_zero = (zero_pos + zero_neg) > 0

    # entry candidates: rows whose value is at most this entry's (the zero block too when the value is positive);
    # one gather each from a (G, 2) table of offsets, column 0 for negative values, column 1 for positive ones
    offset = 2 * group + above
    left = torch.empty((2, n_entries + n_groups), dtype=torch.int64, device=device)  # the entries', then the groups' zero splits
    lp, ln = left[0], left[1]
    torch.add(prefix[0, 1:], _at(torch.stack([-before_pos, zero_pos - before_pos], dim=1).view(-1), offset), out=lp[:n_entries])
    total = torch.stack([-first, zero_pos + zero_neg - first], dim=1).view(-1)
    torch.sub(torch.arange(1, n_entries + 1, device=device) + _at(total, offset), lp[:n_entries], out=ln[:n_entries])
    following = torch.empty_like(value)  # the next distinct value up in the node, NaN if none
    following[:-1] = value[1:]
    following.index_fill_(0, end - 1, float("nan"))
    into_zeros = _where(has_zero & (positives_at > first))  # groups whose last negative value is followed by the zero block
    following.index_fill_(0, _at(positives_at, into_zeros) - 1, 0.0)
    entry_valid = following > value + _SAME_VALUE  # False for NaN: no value above

    # zero candidates: the negative entries and the zero block on the left, the positive entries on the right
    torch.add(below_pos, zero_pos, out=lp[n_entries:])
    torch.add(below_neg, zero_neg, out=ln[n_entries:])
    lowest_positive = _at(value, positives_at.clamp(max=max(n_entries - 1, 0)))
    zero_valid = has_zero & (positives_at < end) & (lowest_positive > _SAME_VALUE)

    node_all = torch.cat([node, group_node])
    # scikit-learn's Gini proxy -n_right gini_right - n_left gini_left, gini = 1 - (n_neg^2 + n_pos^2) / n^2 in float64:
    # squares and sizes are exact integers, so taking them as integers first keeps its rounding
    rp, rn = _at(node_pos, node_all) - lp, _at(node_neg, node_all) - ln
    proxy = _weighted_gini(rp, rn).neg_().sub_(_weighted_gini(lp, ln))
    proxy.masked_fill_(~torch.cat([entry_valid, zero_valid]), -torch.inf)
    groups = torch.arange(n_groups, device=device)
    candidates = _Candidates(node=node_all, latent=torch.cat([latent, _at(latent, first)]), group=torch.cat([group, groups]),
                             left_pos=lp, left_neg=ln,
                             threshold=torch.cat([value, torch.zeros(n_groups, dtype=value.dtype, device=device)]), proxy=proxy)
    return candidates, n_groups


def _weighted_gini(side_pos: torch.Tensor, side_neg: torch.Tensor) -> torch.Tensor:
    """float64 (m,): n gini of sides of (side_pos, side_neg) rows (int64 (m,) each), as scikit-learn rounds it."""
    size = side_pos + side_neg
    gini = (side_neg * side_neg + side_pos * side_pos).to(torch.float64).div_((size * size).to(torch.float64)).neg_().add_(1.0)
    return gini.mul_(size.to(torch.float64))


def _best(candidates: _Candidates, by: torch.Tensor, size: int, rank: torch.Tensor) -> torch.Tensor:
    """For each of `size` bins of `by` (int64 (m,)), the index of its best candidate (highest proxy, then lowest
    `rank`), or -1 where the bin has no valid candidate. Returns int64 (size,)."""
    device = by.device
    top = torch.full((size,), -torch.inf, dtype=torch.float64, device=device)
    top = top.scatter_reduce(0, by, candidates.proxy, "amax", include_self=True)
    best = (candidates.proxy == _at(top, by)) & (candidates.proxy > -torch.inf)
    big = torch.iinfo(torch.int64).max
    lowest = torch.full((size,), big, dtype=torch.int64, device=device)
    lowest = lowest.scatter_reduce(0, by, torch.where(best, rank, big), "amin", include_self=True)
    chosen = _where(best & (rank == _at(lowest, by)))
    index = torch.full((size,), -1, dtype=torch.int64, device=device)
    index[_at(by, chosen)] = chosen
    return index


def _majority(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    return torch.maximum(pos, neg)


def _ranges(starts: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenated ranges [starts[i], starts[i] + lengths[i]): (positions, the range each belongs to), int64."""
    owner = torch.repeat_interleave(torch.arange(starts.numel(), device=starts.device), lengths)
    within = torch.arange(owner.numel(), device=starts.device) - _at(_exclusive_cumsum(lengths), owner)
    return _at(starts, owner) + within, owner


def _squares(right_pos: torch.Tensor, right_neg: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """g = sum of squared class counts over each side's size, float64: the Gini proxy plus the node's size (the form
    the bounds use). Sides must be non-empty."""
    left_pos, left_neg = pos - right_pos, neg - right_neg
    return (left_pos * left_pos + left_neg * left_neg) / (left_pos + left_neg) + (right_pos * right_pos + right_neg * right_neg) / (right_pos + right_neg)


def _pure_side(r: torch.Tensor, same: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """float64: g (`_squares`) of the splits whose right side is r rows of one class (float64, r > 0; -inf where r is
    0), in nodes of `same` rows of that class and `other` of the other (broadcast): the bound of a group whose
    positive-valued rows of that class are r. The same numbers as `_squares(r, 0, same, other)`, in fewer passes."""
    kept = same - r
    return torch.where(r > 0, (kept * kept + other * other) / (kept + other) + r, -torch.inf)


def _zero_split(pos_side: torch.Tensor, neg_side: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor,
                possible: torch.Tensor | None = None) -> torch.Tensor:
    """float64: g (`_squares`) of the zero split ("rows <= 0" left) of groups whose positive-valued rows count
    (pos_side, neg_side), in nodes of (pos, neg) rows (float64, broadcast); -inf where it does not exist: a side is
    empty, or `possible` (bool) is False."""
    size = pos_side + neg_side
    exists = (size > 0) & (size < pos + neg)
    if possible is not None:
        exists &= possible
    return torch.where(exists, _squares(pos_side, neg_side, pos, neg), -torch.inf)


def _count_thresholds(bound: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The least r with g(r, 0) >= bound (a pure positive right side of r rows) and with g(0, r) >= bound, per node
    (float64 (m,) each; `bound` already relaxed). g(r, 0) >= b  <=>  r (N - P + b) >= b n - P^2 - N^2 (multiply by
    n - r > 0), and g(r, 0) grows with r; where the slope is not positive or the bound is -inf, 1 (no pruning)."""
    n = pos + neg
    need = bound * n - pos * pos - neg * neg
    out = []
    for slope in (neg - pos + bound, pos - neg + bound):
        r = torch.ceil(need / slope - 1e-6)
        out.append(torch.where((slope > 0) & torch.isfinite(bound), r.clamp(min=1.0), torch.ones_like(r)))
    return out[0], out[1]


@dataclass
class _Fixed:
    """A block's entries in one fixed order, (concept, latent, value), and what is looked up in it (module docstring).

    sample, latent: int64 (E,), value: float64 (E,). run_key: int64 (R,) concept * L + latent of each (concept,
    latent) run, ascending; run_start, run_length (R,). by_sample: int64 (E,) entry positions grouped by sample,
    sample_start, sample_nnz (S,). positive: bool (S,) each sample's class. signed: bool (R,) runs with a negative
    value (never pruned); unclear: bool (R,) runs with a positive value within 1e-7 of 0 (their zero split may not
    exist: never a known split). signed_table, unclear_table: bool (C, L) the same by (concept, latent), None when
    no run is flagged. single_table: bool (C, L), runs whose values are all one positive value (binary codes): their
    only split in any node is the zero split, known from the class counts; None when no run is."""

    sample: torch.Tensor
    latent: torch.Tensor
    value: torch.Tensor
    run_key: torch.Tensor
    run_start: torch.Tensor
    run_length: torch.Tensor
    by_sample: torch.Tensor
    sample_start: torch.Tensor
    sample_nnz: torch.Tensor
    positive: torch.Tensor
    signed: torch.Tensor
    unclear: torch.Tensor
    signed_table: torch.Tensor | None
    unclear_table: torch.Tensor | None
    single_table: torch.Tensor | None

    def runs(self, concept: torch.Tensor, latent: torch.Tensor, n_latents: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Entry positions of the runs of (concept, latent) pairs (m,) (pairs without entries give none), and the
        pair each position belongs to."""
        key = concept * n_latents + latent
        run = torch.searchsorted(self.run_key, key).clamp(max=self.run_key.numel() - 1)
        length = torch.where(_at(self.run_key, run) == key, _at(self.run_length, run), 0)
        return _ranges(_at(self.run_start, run), length)

    def of_samples(self, samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Entry positions of these samples (m,), and the sample index (into `samples`) each belongs to."""
        index, owner = _ranges(_at(self.sample_start, samples), _at(self.sample_nnz, samples))
        return _at(self.by_sample, index), owner


def _pair_order(major: torch.Tensor, minor: torch.Tensor, n_major: int, n_minor: int) -> torch.Tensor:
    """int64 (m,): the order that sorts distinct (major, minor) pairs (int64 (m,) each, in [0, n_major) x [0,
    n_minor)). On the CPU two counting sorts (scipy's COO -> CSR -> CSC conversions, linear in m: 3.3x faster than an
    argsort at 3.4 M pairs); elsewhere one argsort of major * n_minor + minor."""
    if major.device.type != "cpu":
        return torch.argsort(major * n_minor + minor)
    m = major.numel()
    by_minor = sparse.csr_array((np.arange(m, dtype=np.int64), (minor.numpy(), major.numpy())), shape=(n_minor, n_major))
    return torch.from_numpy(by_minor.tocsc().data)


def _fixed(sample_concept: torch.Tensor, sample_positive: torch.Tensor, entry_sample: torch.Tensor, entry_latent: torch.Tensor,
           entry_value: torch.Tensor, entry_rank: torch.Tensor, n_samples: int, n_latents: int) -> _Fixed:
    """The block's entries in (concept, latent, value) order (entries come grouped by sample, in sample order, with a
    rank that orders them by (latent, value)), their runs and flags."""
    span = int(entry_rank.max()) + 1 if entry_rank.numel() else 1
    n_concepts = int(sample_concept.max()) + 1 if n_samples else 1
    order = _pair_order(_at(sample_concept, entry_sample), entry_rank, n_concepts, span)
    sample, latent, value = _at(entry_sample, order), _at(entry_latent, order), _at(entry_value, order)
    key = _at(sample_concept, sample) * n_latents + latent
    start = torch.ones_like(key, dtype=torch.bool)
    start[1:] = key[1:] != key[:-1]
    run_start = torch.nonzero(start).squeeze(1)
    run_length = torch.diff(torch.cat([run_start, torch.tensor([key.numel()], device=key.device)]))
    run_of = torch.cumsum(start, 0) - 1
    signed = torch.zeros(run_start.numel(), dtype=torch.bool, device=key.device).index_fill_(0, run_of[value < 0], True)
    unclear = torch.zeros_like(signed).index_fill_(0, run_of[(value > 0) & (value <= _SAME_VALUE)], True)
    lowest = torch.full((run_start.numel(),), torch.inf, dtype=value.dtype, device=key.device).scatter_reduce(0, run_of, value, "amin")
    highest = torch.full_like(lowest, -torch.inf).scatter_reduce(0, run_of, value, "amax")
    single = (lowest == highest) & ~signed & ~unclear
    by_sample = torch.empty_like(order)
    by_sample[order] = torch.arange(order.numel(), device=order.device)  # entries came in sample order
    nnz = torch.bincount(entry_sample, minlength=n_samples)

    def table(flags: torch.Tensor) -> torch.Tensor | None:
        if not bool(flags.any()):
            return None
        out = torch.zeros(n_concepts * n_latents, dtype=torch.bool, device=key.device)
        out[key[run_start][flags]] = True
        return out.view(n_concepts, n_latents)

    return _Fixed(sample=sample, latent=latent, value=value, run_key=key[run_start], run_start=run_start, run_length=run_length,
                  by_sample=by_sample, sample_start=_exclusive_cumsum(nnz), sample_nnz=nnz, positive=sample_positive, signed=signed,
                  unclear=unclear, signed_table=table(signed), unclear_table=table(unclear), single_table=table(single))


def _select(dense_pos: torch.Tensor, dense_neg: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, signed: torch.Tensor | None,
            unclear: torch.Tensor | None, single: torch.Tensor | None, concept: torch.Tensor, widest: int, upper: torch.Tensor,
            slot: torch.Tensor, drift: torch.Tensor) -> torch.Tensor:
    """bool (B, L): the (node, latent) groups of dense nodes that may hold the node's best split (module docstring):
    a group whose positive-valued rows count (mp, mn) has max(g(mp, 0), g(0, mn)) below a split the node is known
    to have (the best zero split, "rows <= 0" left, of its `_KNOWN_GROUPS` groups most enriched in each class: it
    exists when both sides hold rows and no positive value is within 1e-7 of 0) holds no better split, since every
    split of the group sends a subset of those rows right and g(a, b) <= max(g(a, 0), g(0, b)) with g(a, 0)
    increasing in a. signed, unclear: bool (B, L) or None: groups always searched, and groups whose zero split may
    not exist. widest: rows of the largest node.
    upper, slot, drift: a bound on each group's best split carried from earlier levels (`_grow`; inf: none), for row
    i upper[slot[i]] + drift[i] (upper: the float64 (slots, L) pool; slot: int64 (B,); drift: float64 (B,)). single:
    bool (C, L) or None by concept (row i's: concept[i], int64 (B,)), groups of one value, whose only split (the zero
    split) is scored from the counts: searched only when it reaches the known split. Both are read only at the groups
    the counts keep."""
    pos64, neg64 = pos.to(torch.float64), neg.to(torch.float64)
    # the zero splits of the groups most enriched in either class (a subset: any split found is a valid bound). The
    # enrichment mp N - mn P (exact: int32 while it fits) is 0 for a group with no row or every row on its positive
    # side, whose zero split does not exist
    exact = torch.int32 if widest * widest < 2**31 else torch.int64
    enrichment = dense_pos.to(exact) * neg.to(exact)[:, None] - dense_neg.to(exact) * pos.to(exact)[:, None]
    if unclear is not None:
        enrichment = torch.where(unclear, 0, enrichment)
    most = min(_KNOWN_GROUPS, dense_pos.shape[1])
    ends = torch.cat([torch.topk(enrichment, most, dim=1, largest=largest, sorted=False).indices for largest in (True, False)], dim=1)
    mp, mn = torch.gather(dense_pos, 1, ends).to(torch.float64), torch.gather(dense_neg, 1, ends).to(torch.float64)
    known = _zero_split(mp, mn, pos64[:, None], neg64[:, None], None if unclear is None else ~torch.gather(unclear, 1, ends)).amax(dim=1)
    known = known - 1e-9 * known.abs().clamp(min=1.0)  # relaxed: rounding may only add groups
    r_pos, r_neg = _count_thresholds(known, pos64, neg64)
    big = float(torch.iinfo(torch.int32).max)
    out = (dense_pos >= r_pos.clamp(max=big).to(torch.int32)[:, None]) | (dense_neg >= r_neg.clamp(max=big).to(torch.int32)[:, None])
    # the carried bounds and the single-valued groups' exact splits, on the few groups the counts kept (1-7 %)
    n_latents = out.shape[1]
    cell, row, latent = _cells(out)
    keep = _at(upper.view(-1), _at(slot, row) * n_latents + latent) >= _at(known - drift, row)
    if single is not None:
        mp, mn = _at(dense_pos.view(-1), cell).to(torch.float64), _at(dense_neg.view(-1), cell).to(torch.float64)
        zero = _zero_split(mp, mn, _at(pos64, row), _at(neg64, row))
        scored = (zero > -torch.inf) & (zero >= _at(known, row))
        keep &= torch.where(_at(single.view(-1), _at(concept, row) * n_latents + latent), scored, True)
    out.view(-1).index_fill_(0, _at(cell, _where(~keep)), False)
    return out if signed is None else out | signed


def _drift(pos: torch.Tensor, neg: torch.Tensor, moved_pos: torch.Tensor, moved_neg: torch.Tensor, most_pos: torch.Tensor,
           most_neg: torch.Tensor) -> torch.Tensor:
    """float64 (m,): how much a split of a (node, latent) group can gain, in the bounds' form g, when the node loses
    (moved_pos, moved_neg) rows that hold 0 on the latent, leaving (pos, neg): an upper bound over every group of
    the node whose positive-valued rows count at most (most_pos, most_neg) and have no negative value.

    Such rows sit on the left of every split of the group, so only the left term of g = f(right) + f(left) changes,
    f(a, b) = (a^2 + b^2) / (a + b) = a + b - 2 q(a, b), q(a, b) = ab / (a + b). q is concave, so with (a, b) the
    new left side, q(a + dp, b + dn) - q(a, b) <= dp t^2 + dn (1 - t)^2, t = b / (a + b): the change is at most
    D(t) = -(dp + dn) + 2 (dp t^2 + dn (1 - t)^2), convex in t, and t = (neg - rn) / (pos + neg - rp - rn) over the
    right sides (rp <= most_pos, rn <= most_neg) lies between its values at (0, most_neg) and (most_pos, 0)."""
    pos, neg = pos.to(torch.float64), neg.to(torch.float64)
    dp, dn = moved_pos.to(torch.float64), moved_neg.to(torch.float64)
    mp, mn = most_pos.to(torch.float64), most_neg.to(torch.float64)
    high = (neg / (pos + neg - mp).clamp(min=1.0)).clamp(max=1.0)
    low = ((neg - mn).clamp(min=0.0) / (pos + neg - mn).clamp(min=1.0)).clamp(max=1.0)
    bound = [-(dp + dn) + 2.0 * (dp * t * t + dn * (1.0 - t) * (1.0 - t)) for t in (low, high)]
    return torch.maximum(bound[0], bound[1])


@dataclass
class _Grown:
    """One block's trees, per concept (host arrays): majority, n (rows), correct: (levels, C) rows classified
    correctly by the tree cut after level 1, 2, ... (constant once the tree is complete), depth (C,), chain: (C,
    n_chain) rows classified correctly by the root split after 0, 1, ... removals (-1: no latent left), root (C,)."""

    majority: np.ndarray
    n: np.ndarray
    correct: np.ndarray
    depth: np.ndarray
    chain: np.ndarray
    root: np.ndarray


def _level_entries(fixed: _Fixed, s_node: torch.Tensor, node_concept: torch.Tensor, dense_node: torch.Tensor,
                   selected: torch.Tensor | None, direct: torch.Tensor, n_latents: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The entries whose candidates a level evaluates, as (node, entry position), grouped by (node, latent) in
    value order: for dense nodes those of the selected groups (bool (B, L), row i = node dense_node[i], -1: none),
    for the `direct` nodes (bool (N,)) all of their rows' entries."""
    parts_node, parts_position = [], []
    if selected is not None:
        _, row, latent = _cells(selected)
        node = _at(dense_node, row)
        ok = _where(node >= 0)
        latent, node = _at(latent, ok), _at(node, ok)
        positions, pair = fixed.runs(_at(node_concept, node), latent, n_latents)
        node = _at(node, pair)
        mine = _where(_at(s_node, _at(fixed.sample, positions)) == node)
        parts_node.append(_at(node, mine))
        parts_position.append(_at(positions, mine))
    samples = _where(_at(direct, s_node.clamp(min=0)) & (s_node >= 0))
    if samples.numel():
        positions, owner = fixed.of_samples(samples)
        node = _at(_at(s_node, samples), owner)
        order = torch.argsort(node * fixed.sample.numel() + positions)  # fixed order within a node: (latent, value)
        parts_node.append(_at(node, order))
        parts_position.append(_at(positions, order))
    if not parts_node:
        empty = torch.zeros(0, dtype=torch.int64, device=s_node.device)
        return empty, empty
    return torch.cat(parts_node), torch.cat(parts_position)


def _grow(sample_concept: torch.Tensor, sample_positive: torch.Tensor, entry_sample: torch.Tensor, entry_latent: torch.Tensor,
          entry_value: torch.Tensor, entry_rank: torch.Tensor, n_concepts: int, n_latents: int, n_chain: int, dense_cells: int) -> _Grown:
    """Grow the Gini trees of `n_concepts` concepts together (module docstring: how).

    sample_concept: int64 (S,) ascending, the concept of each row sample; sample_positive: bool (S,) its class (every
    concept has both). entry_*: (E,) the samples' non-zero entries grouped by sample, in sample order (sample index,
    latent, float64 value, and a rank that orders entries by (latent, value)). n_chain: root splits of the removal
    chain to rank (max(removals) + 1). dense_cells: (node, latent) count cells kept at most (a node without them is
    searched through its entries).
    """
    device = sample_concept.device
    n_samples = sample_concept.numel()
    fixed = _fixed(sample_concept, sample_positive, entry_sample, entry_latent, entry_value, entry_rank, n_samples, n_latents)
    s_positive = sample_positive
    s_node = sample_concept.clone()
    node_pos = torch.zeros(n_concepts, dtype=torch.int64, device=device).index_add_(0, s_node, s_positive.to(torch.int64))
    n = torch.bincount(s_node, minlength=n_concepts)
    node_neg = n - node_pos
    node_concept = torch.arange(n_concepts, device=device)
    node_entries = torch.zeros(n_concepts, dtype=torch.int64, device=device).index_add_(0, s_node, fixed.sample_nnz)
    majority = _majority(node_pos, node_neg)
    correct = majority.clone()
    widest = int(n.max()) + 1  # a node's candidates rank by latent, then rows on the left

    # Dense nodes keep a slot of class counts per latent (a node whose entries outnumber half the latents: scanning L
    # counts is then cheaper than its entries); a split node's larger child keeps its slot (the smaller child's
    # counts subtracted), the smaller child takes a free slot if it is dense too and one is free.
    n_slots = max(1, min(dense_cells // n_latents, 2 * n_concepts))
    dense_roots = torch.nonzero(2 * node_entries >= n_latents).squeeze(1)[:n_slots]
    node_slot = torch.full((n_concepts,), -1, dtype=torch.int64, device=device)
    node_slot[dense_roots] = torch.arange(dense_roots.numel(), device=device)
    slot_node = torch.full((n_slots,), -1, dtype=torch.int64, device=device)
    slot_node[: dense_roots.numel()] = dense_roots
    pool_pos = torch.zeros((n_slots, n_latents), dtype=torch.int32, device=device)
    pool_neg = torch.zeros_like(pool_pos)
    # bounds on the groups' best splits carried from level to level: pool_upper + slot_drift[slot] (inf: none); a
    # slot's drift grows with the rows its node loses (`_drift`), for the largest groups counted when it was filled
    pool_upper = torch.full((n_slots, n_latents), torch.inf, dtype=torch.float64, device=device)
    slot_drift = torch.zeros(n_slots, dtype=torch.float64, device=device)
    _root_counts(fixed, node_slot, pool_pos, pool_neg)
    slot_most_pos, slot_most_neg = pool_pos.amax(dim=1), pool_neg.amax(dim=1)
    chain, best = _rank_chain(fixed, dense_roots, pool_pos[: dense_roots.numel()], pool_neg[: dense_roots.numel()], s_node, node_pos,
                              node_neg, n_concepts, n_latents, n_chain)  # best: the roots' splits, the first level's
    root = torch.full((n_concepts,), -1, dtype=torch.int64, device=device)
    root[best.node] = best.latent
    levels, split_levels = [], []
    n_nodes = n_concepts
    while n_nodes:
        if levels:
            used = torch.nonzero(slot_node >= 0).squeeze(1)
            selected, dense_rows = None, slot_node[used]
            if used.numel():
                concepts = node_concept[dense_rows]
                every = used.numel() == n_slots  # every slot in use (slot i at row i): the pools as they are, no copy
                selected = _select(pool_pos if every else pool_pos[used], pool_neg if every else pool_neg[used],
                                   node_pos[dense_rows], node_neg[dense_rows],
                                   None if fixed.signed_table is None else fixed.signed_table[concepts],
                                   None if fixed.unclear_table is None else fixed.unclear_table[concepts],
                                   fixed.single_table, concepts, widest, pool_upper, used, slot_drift[used])
            e_node, e_position = _level_entries(fixed, s_node, node_concept, dense_rows, selected, node_slot < 0, n_latents)
            if not e_node.numel():
                break
            cands, _ = _candidates(e_node, _at(fixed.latent, e_position), _at(fixed.value, e_position),
                                   _at(s_positive, _at(fixed.sample, e_position)), node_pos, node_neg)
            pick = _best(cands, cands.node, n_nodes, cands.latent * widest + cands.left_pos + cands.left_neg)
            pick = _at(pick, _where(pick >= 0))
            # the searched groups of dense nodes: their best split, exactly (every group has a zero candidate, -inf if
            # invalid), in the bounds' form, replaces the bound carried so far
            of_dense = _where(_at(node_slot, cands.node) >= 0)
            at_node = _at(cands.node, of_dense)
            at_slot = _at(node_slot, at_node)
            pool_upper.view(-1).scatter_reduce_(0, at_slot * n_latents + _at(cands.latent, of_dense),
                                                _at(cands.proxy, of_dense) + _at(node_pos + node_neg, at_node).to(torch.float64)
                                                - _at(slot_drift, at_slot), "amax", include_self=False)
            best = _Splits(*(_at(getattr(cands, name), pick) for name in ("node", "latent", "proxy", "left_pos", "left_neg", "threshold")))
        if not best.node.numel():
            break
        split = torch.zeros(n_nodes, dtype=torch.bool, device=device).index_fill_(0, best.node, True)
        split_latent = torch.zeros(n_nodes, dtype=torch.int64, device=device).index_copy_(0, best.node, best.latent)
        threshold = torch.zeros(n_nodes, dtype=best.threshold.dtype, device=device).index_copy_(0, best.node, best.threshold)
        left_pos = torch.zeros(n_nodes, dtype=torch.int64, device=device).index_copy_(0, best.node, best.left_pos)
        left_neg = torch.zeros(n_nodes, dtype=torch.int64, device=device).index_copy_(0, best.node, best.left_neg)
        gain = _majority(left_pos, left_neg) + _majority(node_pos - left_pos, node_neg - left_neg) - _majority(node_pos, node_neg)
        correct.index_add_(0, node_concept, torch.where(split, gain, 0))
        levels.append(correct.clone())
        split_levels.append(torch.zeros(n_concepts, dtype=torch.bool, device=device).index_fill_(0, node_concept[split], True))

        # each row of a split node goes left (value <= threshold) or right
        split_nodes = torch.nonzero(split).squeeze(1)
        positions, pair = fixed.runs(node_concept[split_nodes], split_latent[split_nodes], n_latents)
        on = _at(fixed.sample, positions)
        mine = _where(_at(s_node, on) == _at(split_nodes, pair))
        sample_value = torch.zeros(n_samples, dtype=fixed.value.dtype, device=device)
        sample_value[_at(on, mine)] = _at(fixed.value, _at(positions, mine))
        node_of = s_node.clamp(min=0)
        s_split = (s_node >= 0) & _at(split, node_of)
        right = (sample_value > _at(threshold, node_of)).to(torch.int64)
        split_rank = torch.cumsum(split.to(torch.int64), 0) - 1
        child = torch.where(s_split, 2 * _at(split_rank, node_of) + right, -1)
        n_children = 2 * split_nodes.numel()
        splitting = _where(s_split)
        in_child = _at(child, splitting)
        child_pos = torch.zeros(n_children, dtype=torch.int64, device=device).index_add_(0, in_child, _at(s_positive, splitting).to(torch.int64))
        child_n = torch.bincount(in_child, minlength=n_children)
        child_neg = child_n - child_pos
        child_entries = torch.zeros(n_children, dtype=torch.int64, device=device).index_add_(0, in_child, _at(fixed.sample_nnz, splitting))
        active = (child_pos > 0) & (child_neg > 0)  # impure children are the next level's nodes
        new_id = torch.cumsum(active.to(torch.int64), 0) - 1

        # slots: a split dense node's slot loses its smaller child's counts and goes to the larger child (if that is
        # a dense node of the next level); the smaller child gets a free slot if it is one; every other slot is freed
        dense_split = split_nodes[node_slot[split_nodes] >= 0]
        first_child = 2 * split_rank[dense_split]
        small_side = (child_entries[first_child + 1] < child_entries[first_child]).to(torch.int64)
        small, large = first_child + small_side, first_child + 1 - small_side
        parent_slot = node_slot[dense_split]
        slot_of_child = torch.full((n_children,), -1, dtype=torch.int64, device=device)
        slot_of_child[small] = parent_slot
        moving = _at(splitting, _where(_at(slot_of_child, in_child) >= 0))  # rows of the smaller children of dense nodes
        moving_child = _at(child, moving)
        moved_cells = _add_counts(fixed, moving, _at(slot_of_child, moving_child), pool_pos, pool_neg, -1)
        dense_next = active & (2 * child_entries >= n_latents)
        keeps = dense_next[large]
        # the larger child's groups keep their bounds, moved by at most `_drift`; a group some moved row had a value
        # on changed its rows: no bound
        pool_upper.view(-1).index_fill_(0, moved_cells, torch.inf)
        kept_slot, kept_large, kept_small = parent_slot[keeps], large[keeps], small[keeps]
        drift = _drift(child_pos[kept_large], child_neg[kept_large], child_pos[kept_small], child_neg[kept_small],
                       slot_most_pos[kept_slot], slot_most_neg[kept_slot])
        slack = 1e-9 * (child_n[kept_large] + child_n[kept_small]).to(torch.float64)  # rounding of the bounds
        slot_drift.index_add_(0, kept_slot, drift + slack)
        slot_of_child.fill_(-1)
        slot_of_child[large[keeps]] = parent_slot[keeps]
        kept = torch.zeros(n_slots, dtype=torch.bool, device=device)
        kept[parent_slot[keeps]] = True
        freed = torch.nonzero((slot_node >= 0) & ~kept).squeeze(1)
        pool_pos.index_fill_(0, freed, 0)
        pool_neg.index_fill_(0, freed, 0)
        pool_upper.index_fill_(0, freed, torch.inf)
        slot_drift.index_fill_(0, freed, 0.0)
        wanting = small[dense_next[small]]
        free = torch.nonzero(~kept).squeeze(1)[: wanting.numel()]
        wanting = wanting[: free.numel()]
        slot_of_child[wanting] = free
        _add_counts(fixed, moving, torch.where(torch.isin(moving_child, wanting), _at(slot_of_child, moving_child), -1), pool_pos, pool_neg, 1)
        filled = slot_of_child[wanting]
        slot_most_pos[filled], slot_most_neg[filled] = pool_pos[filled].amax(dim=1), pool_neg[filled].amax(dim=1)

        child_of = child.clamp(min=0)
        keep_sample = s_split & _at(active, child_of)
        s_node = torch.where(keep_sample, _at(new_id, child_of), -1)
        node_concept = node_concept[split_nodes.repeat_interleave(2)][active]
        node_pos, node_neg = child_pos[active], child_neg[active]
        node_slot = slot_of_child[active]
        slot_node = torch.full((n_slots,), -1, dtype=torch.int64, device=device)
        has = node_slot >= 0
        slot_node[node_slot[has]] = torch.nonzero(has).squeeze(1)
        n_nodes = int(active.sum())
    correct_levels = torch.stack(levels) if levels else torch.zeros((0, n_concepts), dtype=torch.int64, device=device)
    depth = torch.stack(split_levels).sum(0) if split_levels else torch.zeros(n_concepts, dtype=torch.int64, device=device)
    return _Grown(majority=majority.cpu().numpy(), n=n.cpu().numpy(), correct=correct_levels.cpu().numpy(),
                  depth=depth.cpu().numpy(), chain=chain.cpu().numpy(), root=root.cpu().numpy())


def _add_counts(fixed: _Fixed, samples: torch.Tensor, slot: torch.Tensor, pool_pos: torch.Tensor, pool_neg: torch.Tensor, sign: int) -> torch.Tensor:
    """Add `sign` to the class counts of slot[i] for every latent on which samples[i] has a positive value (slot -1:
    skipped). pool_*: int32 (slots, L), updated in place. Returns the flat (slot * L + latent) cells counted, int64."""
    keep = _where(slot >= 0)
    samples, slot = _at(samples, keep), _at(slot, keep)
    positions, owner = fixed.of_samples(samples)
    counted = _where(_at(fixed.value, positions) > 0)
    positions, owner = _at(positions, counted), _at(owner, counted)
    flat = _at(slot, owner) * pool_pos.shape[1] + _at(fixed.latent, positions)
    cls = _at(fixed.positive, _at(samples, owner))
    for pool, mask in ((pool_pos, cls), (pool_neg, ~cls)):
        chosen = _where(mask)
        pool.view(-1).index_add_(0, _at(flat, chosen), torch.full((chosen.numel(),), sign, dtype=torch.int32, device=flat.device))
    return flat


def _root_counts(fixed: _Fixed, concept_slot: torch.Tensor, pool_pos: torch.Tensor, pool_neg: torch.Tensor) -> None:
    """The roots' class counts: slot concept_slot[c] (int64 (C,), -1: none) of the zeroed pools (int32 (slots, L))
    gets, per latent, the positive and negative rows of concept c with a positive value on it. What `_add_counts`
    adds for every row, as segmented sums over the (concept, latent) runs of the fixed order (no entry gathered by
    row: 0.13-0.15 s -> 0.044 s on the 3.6 M entries of the bench TopK cell's codes, one thread)."""
    n_latents = pool_pos.shape[1]
    slot = _at(concept_slot, torch.div(fixed.run_key, n_latents, rounding_mode="floor"))
    keep = _where(slot >= 0)
    cell = _at(slot, keep) * n_latents + _at(fixed.run_key % n_latents, keep)
    start = _at(fixed.run_start, keep)
    end = start + _at(fixed.run_length, keep)
    up = fixed.value > 0
    cls = _at(fixed.positive, fixed.sample)
    for pool, mask in ((pool_pos, up & cls), (pool_neg, up & ~cls)):
        total = torch.zeros(mask.numel() + 1, dtype=torch.int64, device=mask.device)
        torch.cumsum(mask, 0, out=total[1:])
        pool.view(-1).index_copy_(0, cell, (_at(total, end) - _at(total, start)).to(pool.dtype))


def _ranked(node: torch.Tensor, latent: torch.Tensor, proxy: torch.Tensor, n_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The order that sorts groups by (node, proxy descending, latent), and each group's rank within its node (in
    that order)."""
    order = torch.argsort(latent, stable=True)
    order = order[torch.sort(proxy[order], descending=True, stable=True).indices]
    order = order[torch.argsort(node[order], stable=True)]
    first = _exclusive_cumsum(torch.bincount(node, minlength=n_nodes))
    return order, torch.arange(order.numel(), device=node.device) - first[node[order]]


@dataclass
class _Splits:
    """Splits, one per (node, latent) group or per node: (m,) tensors. node, latent: where; proxy: scikit-learn's
    Gini proxy; left_pos, left_neg: class counts of the rows at or below `threshold` (a value of the latent)."""

    node: torch.Tensor
    latent: torch.Tensor
    proxy: torch.Tensor
    left_pos: torch.Tensor
    left_neg: torch.Tensor
    threshold: torch.Tensor

    def take(self, index: torch.Tensor) -> "_Splits":
        return _Splits(*(_at(getattr(self, f.name), index) for f in fields(self)))


def _group_scores(fixed: _Fixed, s_node: torch.Tensor, node_concept: torch.Tensor, dense_node: torch.Tensor, selected: torch.Tensor | None,
                  direct: torch.Tensor, node_pos: torch.Tensor, node_neg: torch.Tensor, n_latents: int) -> _Splits:
    """The best split of each searched (node, latent) group that has one (`_level_entries` says which are searched;
    within a group, ties go to the lowest threshold)."""
    e_node, e_position = _level_entries(fixed, s_node, node_concept, dense_node, selected, direct, n_latents)
    if not e_node.numel():
        empty = torch.zeros(0, dtype=torch.int64, device=s_node.device)
        return _Splits(empty, empty, empty.to(torch.float64), empty, empty, empty.to(fixed.value.dtype))
    cands, n_groups = _candidates(e_node, _at(fixed.latent, e_position), _at(fixed.value, e_position),
                                  _at(fixed.positive, _at(fixed.sample, e_position)), node_pos, node_neg)
    pick = _best(cands, cands.group, n_groups, cands.left_pos + cands.left_neg)
    pick = _at(pick, _where(pick >= 0))
    return _Splits(_at(cands.node, pick), _at(cands.latent, pick), _at(cands.proxy, pick), _at(cands.left_pos, pick),
                   _at(cands.left_neg, pick), _at(cands.threshold, pick))


def _rank_chain(fixed: _Fixed, dense_node: torch.Tensor, dense_pos: torch.Tensor, dense_neg: torch.Tensor, s_node: torch.Tensor,
                node_pos: torch.Tensor, node_neg: torch.Tensor, n_concepts: int, n_latents: int, n_chain: int) -> tuple[torch.Tensor, _Splits]:
    """The removal chain and the roots' splits. chain: int64 (C, n_chain), rows the root split of the p-th best latent
    classifies correctly (the root split after p removals), -1 past the last latent that can split. Latents rank by
    their best root split's proxy, then by index (within a latent, the lowest threshold), so the first is the tree's
    root split: the splits of the roots that have one, node = concept (the first level of `_grow` takes them).
    Of a dense root, only the latents whose bound reaches the n_chain-th best of the splits known (the exact best
    splits of its 4 n_chain best-bounded latents, the zero splits of the others) are searched."""
    device = s_node.device
    concepts = torch.arange(n_concepts, device=device)
    direct = torch.ones(n_concepts, dtype=torch.bool, device=device)
    direct[dense_node] = False
    selected = None
    if dense_node.numel():
        pos = node_pos[dense_node].to(torch.float64)[:, None]
        neg = node_neg[dense_node].to(torch.float64)[:, None]
        mp, mn = dense_pos.to(torch.float64), dense_neg.to(torch.float64)
        bound = torch.maximum(_pure_side(mp, pos, neg), _pure_side(mn, neg, pos))
        zero_split = _zero_split(mp, mn, pos, neg)
        if fixed.single_table is not None:  # one value: the zero split is the only split, scored exactly
            bound = torch.where(fixed.single_table[dense_node], zero_split, bound)
        if fixed.signed_table is not None:
            bound = torch.where(fixed.signed_table[dense_node], torch.inf, bound)
        first = torch.zeros_like(bound, dtype=torch.bool)
        first.scatter_(1, torch.topk(bound, min(n_latents, 4 * n_chain), dim=1).indices, True)
        nothing = torch.zeros(n_concepts, dtype=torch.bool, device=device)
        groups = _group_scores(fixed, s_node, concepts, dense_node, first & (bound > -torch.inf), nothing, node_pos, node_neg, n_latents)
        # each latent's best split known so far, in the bound's form: the searched ones exactly, the others' zero split
        # ("rows <= 0" left: it exists when both sides hold rows and no positive value is within 1e-7 of 0)
        known = zero_split if fixed.unclear_table is None else zero_split.masked_fill(fixed.unclear_table[dense_node], -torch.inf)
        row_of = torch.full((n_concepts,), -1, dtype=torch.int64, device=device)
        row_of[dense_node] = torch.arange(dense_node.numel(), device=device)
        exact = groups.proxy + _at(node_pos + node_neg, groups.node).to(torch.float64)
        known.view(-1).scatter_reduce_(0, _at(row_of, groups.node) * n_latents + groups.latent, exact, "amax")
        kth = torch.topk(known, min(n_latents, n_chain), dim=1).values[:, -1]  # the n_chain-th best latent reaches this
        selected = bound >= (kth - 1e-9 * kth.abs().clamp(min=1.0))[:, None]
    groups = _group_scores(fixed, s_node, concepts, dense_node, selected, direct, node_pos, node_neg, n_latents)
    order, rank = _ranked(groups.node, groups.latent, groups.proxy, n_concepts)
    node = groups.node
    correct = (_majority(groups.left_pos, groups.left_neg)
               + _majority(_at(node_pos, node) - groups.left_pos, _at(node_neg, node) - groups.left_neg))
    chain = torch.full((n_concepts, n_chain), -1, dtype=torch.int64, device=device)
    keep = rank < n_chain
    chain[node[order[keep]], rank[keep]] = correct[order[keep]]
    return chain, groups.take(order[rank == 0])


def _concept_rows(y: np.ndarray, max_n: int, balanced: bool, rng: np.random.Generator) -> np.ndarray:
    """Sorted row indices used for one concept (see the module docstring)."""
    if not balanced:
        if y.size <= max_n:
            return np.arange(y.size)
        return np.sort(rng.choice(y.size, size=max_n, replace=False))
    pos, neg = np.flatnonzero(y), np.flatnonzero(~y)
    m = min(pos.size, neg.size, max_n // 2)
    return np.sort(np.concatenate([rng.choice(pos, size=m, replace=False), rng.choice(neg, size=m, replace=False)]))


def _blocks(sizes: np.ndarray, parts: int, limit: int, most: int) -> list[np.ndarray]:
    """Consecutive runs of indices: `parts` runs of about equal `sizes` sums (an index joins the run its size's
    midpoint falls in, so there are never more), each cut further where it would pass `limit` summed (a single larger
    one alone) or `most` indices."""
    if sizes.size == 0:
        return []
    ends = np.cumsum(sizes, dtype=np.float64)
    part = np.minimum((ends - sizes / 2.0) * parts // max(ends[-1], 1.0), parts - 1).astype(np.int64)
    out = []
    for members in np.split(np.arange(sizes.size), np.flatnonzero(np.diff(part)) + 1):
        current, total = [], 0
        for i, size in zip(members.tolist(), sizes[members].tolist()):
            if current and (total + size > limit or len(current) >= most):
                out.append(np.array(current))
                current, total = [], 0
            current.append(i)
            total += size
        out.append(np.array(current))
    return out


def _parts(entries: int, jobs: int, block_entries: int) -> int:
    """Blocks to cut `entries` into: the fewest of at most `block_entries` each, rounded up to a multiple of `jobs`
    (blocks grow in rounds of one per thread; a block more would grow alone after the others)."""
    needed = max(1, -(-entries // block_entries))
    return jobs * -(-needed // jobs)


def _scores(grown: _Grown, removals: tuple[int, ...], levels: str, exhausted: str) -> tuple[np.ndarray, ...]:
    """Per concept of a block: (accs_0, local, global, cut accuracies) from its grown trees."""
    n = grown.n.astype(np.float64)
    depth = grown.depth
    acc = grown.correct / n  # (levels, C)
    acc0 = grown.chain[:, 0] / n
    majority = grown.majority / n
    deeper_levels = np.arange(acc.shape[0])[:, None]
    deeper = (deeper_levels >= 1) & (deeper_levels < depth[None, :])  # levels 2 .. D of each concept
    # summed in level order (a cumulative sum), so that a concept's score does not depend on the others' depths
    terms = np.cumsum(np.where(deeper, acc - acc0[None, :], 0.0), axis=0)[-1] if acc.shape[0] else np.zeros_like(acc0)
    count = deeper.sum(axis=0)
    if levels == "published":  # the no-split level
        terms, count = terms + (majority - acc0), count + 1
    global_ = np.where(count > 0, 1.0 - terms / np.maximum(count, 1), 1.0)
    cuts = np.where(grown.chain >= 0, grown.chain / n[:, None], np.nan if exhausted == "drop" else majority[:, None])
    local_terms = 2.0 * (acc0[:, None] - cuts[:, list(removals)])
    counted = ~np.isnan(local_terms)  # "drop": exhausted counts are NaN and leave the mean
    summed = np.cumsum(np.where(counted, local_terms, 0.0), axis=1)[:, -1]  # in removal order, whatever the block
    local = np.where(counted.any(axis=1), summed / np.maximum(counted.sum(axis=1), 1), np.nan)
    return acc0, local, global_, cuts


Codes = np.ndarray | sparse.sparray | sparse.spmatrix


def _checked_codes(name: str, codes: Codes) -> sparse.csr_array:
    """`codes` as float32 CSR (the trees see float32 values, as scikit-learn's do), or an error naming `name`."""
    if not (isinstance(codes, np.ndarray) or sparse.issparse(codes)) or codes.ndim != 2 or codes.shape[0] == 0 or codes.shape[1] == 0:
        got = getattr(codes, "shape", type(codes))
        raise ValueError(f"{name}: expected a non-empty 2-D numpy array or scipy.sparse matrix (n, n_latents), got {got}")
    if codes.dtype.kind not in "fiub":
        raise TypeError(f"{name}: expected a numeric array, got dtype {codes.dtype}")
    x = to_csr(name, codes, dtype=np.float32)
    if not np.isfinite(x.data).all():
        raise ValueError(f"{name}: contains NaN or infinite values")
    return x


def fms(
    codes: Codes,
    labels: np.ndarray,
    max_n: int = 5000,
    seed: int = 0,
    removals: int | Sequence[int] = PUBLISHED_REMOVALS,
    levels: Literal["published", "paper"] = "published",
    balanced: bool = True,
    exhausted: Literal["drop", "majority"] = "drop",
    device: str | torch.device = "cpu",
    block_entries: int = BLOCK_ENTRIES,
    dense_cells: int = DENSE_CELLS,
) -> FMSResult:
    """Feature Monosemanticity Score of `codes` for binary concepts (see the module docstring).

    codes: (n, n_latents) numeric, finite: a dense array or a scipy.sparse matrix (the same numbers either way).
    labels: (n,) or (n, n_concepts) bool.
    max_n: rows used per concept at most. seed: drives the row subsamples.
    removals: the p of FMS@p, or several to average (default: the published 1..9).
    levels: the levels of the global term, "published" (with the no-split level) or "paper" (2 .. D).
    balanced: per concept, every positive (up to max_n / 2) and as many randomly drawn negatives;
    False = one uniform subsample of max_n rows shared by all concepts, class ratio as in the data.
    exhausted: a removal count that leaves no latent to split: "drop" (published: left out of the mean) or
    "majority" (scores the majority rate).
    device: where the trees are grown (a torch device or its name). block_entries, dense_cells: memory bounds (module
    docstring); the scores do not depend on them.
    """
    return fms_of_sets([codes], labels, max_n=max_n, seed=seed, removals=removals, levels=levels, balanced=balanced,
                       exhausted=exhausted, device=device, block_entries=block_entries, dense_cells=dense_cells)[0]


def fms_of_sets(
    code_sets: Sequence[Codes],
    labels: np.ndarray,
    max_n: int = 5000,
    seed: int = 0,
    removals: int | Sequence[int] = PUBLISHED_REMOVALS,
    levels: Literal["published", "paper"] = "published",
    balanced: bool = True,
    exhausted: Literal["drop", "majority"] = "drop",
    device: str | torch.device = "cpu",
    block_entries: int = BLOCK_ENTRIES,
    dense_cells: int = DENSE_CELLS,
) -> list[FMSResult]:
    """`fms` of each of several code sets of the same rows and concepts (a model's codes, its untrained twin's, random
    codes): one result per set, each the one `fms` gives that set alone (the same rows per concept, the same trees).
    The sets' trees grow together, in shared blocks: a level of a block costs a few hundred torch operations (and, on
    a GPU, a host sync) however many trees it holds, so one block for every set costs less than one per set.

    code_sets: (n, n_latents) codes each (`fms`'s `codes`; the sets may differ in n_latents, not in n). The other
    arguments: as `fms`'s.
    """
    if isinstance(code_sets, (np.ndarray, sparse.sparray, sparse.spmatrix)) or not isinstance(code_sets, Sequence) or not code_sets:
        raise TypeError(f"code_sets: expected a non-empty sequence of code arrays, got {type(code_sets).__name__}")
    names = ["codes"] if len(code_sets) == 1 else [f"code_sets[{i}]" for i in range(len(code_sets))]
    sets = [_checked_codes(name, codes) for name, codes in zip(names, code_sets)]
    n = sets[0].shape[0]
    for name, x in zip(names, sets):
        if x.shape[0] != n:
            raise ValueError(f"{name}: expected {n} rows (the first set's), got {x.shape[0]}")
    if not isinstance(labels, np.ndarray) or labels.dtype != np.bool_:
        raise TypeError(f"labels: expected a bool numpy array, got {getattr(labels, 'dtype', type(labels))}")
    if labels.ndim == 1:
        labels = labels[:, None]
    if labels.ndim != 2 or labels.shape[0] != n or labels.shape[1] == 0:
        raise ValueError(f"labels: expected shape ({n},) or ({n}, n_concepts), got {labels.shape}")
    if not isinstance(max_n, (int, np.integer)) or max_n < 2:
        raise ValueError(f"max_n: expected an int >= 2, got {max_n!r}")
    removals = (removals,) if isinstance(removals, (int, np.integer)) else tuple(removals)
    if not removals or any(isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 1 for p in removals):
        raise ValueError(f"removals: expected ints >= 1, got {removals!r}")
    removals = tuple(int(p) for p in removals)
    if levels not in ("published", "paper"):
        raise ValueError(f"levels: expected 'published' or 'paper', got {levels!r}")
    if exhausted not in ("drop", "majority"):
        raise ValueError(f"exhausted: expected 'drop' or 'majority', got {exhausted!r}")
    device = torch.device(device)
    n_sets, n_concepts = len(sets), labels.shape[1]
    n_latents = max(x.shape[1] for x in sets)
    # every set's rows one under the other (set j's row i is row j n + i), on a common latent axis
    x_all = sparse.vstack([sparse.csr_array((x.data, x.indices, x.indptr), shape=(n, n_latents)) for x in sets], format="csr")
    shared_rows = None if balanced else _concept_rows(labels[:, 0], max_n, False, np.random.default_rng(seed))
    rows = [_concept_rows(labels[:, c], max_n, True, np.random.default_rng([seed, c])) if balanced else shared_rows for c in range(n_concepts)]
    n_rows = np.array([r.size for r in rows], dtype=np.int64)
    row_nnz = np.diff(x_all.indptr)
    scored = []
    for c in range(n_concepts):
        y = labels[rows[c], c]
        if y.all() or not y.any():
            logger.warning("fms: concept %d has a single class on the %d rows used; scored NaN", c, rows[c].size)
        else:
            scored.append(c)
    scored = np.array(scored, dtype=np.int64)
    # the trees to grow: every scored concept of every set, concept by concept (so that each block holds as many trees
    # of each set: the sets' trees differ in cost, e.g. random codes' against a model's)
    tree_set, tree_concept = np.tile(np.arange(n_sets), scored.size), np.repeat(scored, n_sets)

    n_chain = max(removals) + 1
    acc0 = np.full((n_sets, n_concepts), np.nan)
    local = np.full((n_sets, n_concepts), np.nan)
    global_ = np.full((n_sets, n_concepts), np.nan)
    roots = np.full((n_sets, n_concepts), -1, dtype=np.int64)
    depths = np.zeros((n_sets, n_concepts), dtype=np.int64)
    cuts = np.full((n_sets, n_concepts, n_chain), np.nan)
    indptr = torch.as_tensor(x_all.indptr.astype(np.int64), device=device)
    indices = torch.as_tensor(x_all.indices.astype(np.int64), device=device)
    values = torch.as_tensor(x_all.data.astype(np.float64), device=device)
    by_value = torch.argsort(values, stable=True)
    by_value = by_value[torch.argsort(indices[by_value], stable=True)]
    value_rank = torch.empty_like(by_value)
    value_rank[by_value] = torch.arange(by_value.numel(), device=device)  # each stored entry's rank in (latent, value) order
    entries = np.array([int(row_nnz[rows[c] + j * n].sum()) for j, c in zip(tree_set, tree_concept)], dtype=np.int64)
    per_block = max(1, dense_cells // n_latents)  # trees whose roots all keep dense counts
    jobs = available_threads() if device.type == "cpu" else 1  # on the CPU, blocks grow side by side (torch frees the GIL)
    parts = _parts(int(entries.sum()), jobs, block_entries)

    def grow(block: np.ndarray) -> tuple[np.ndarray, _Grown]:
        in_set, concepts = tree_set[block], tree_concept[block]
        sample_rows = np.concatenate([rows[c] + j * n for j, c in zip(in_set, concepts)])
        sample_concept = np.repeat(np.arange(block.size), [rows[c].size for c in concepts])
        positive = np.concatenate([labels[rows[c], c] for c in concepts])
        s_rows = torch.as_tensor(sample_rows.astype(np.int64), device=device)
        nnz = indptr[s_rows + 1] - indptr[s_rows]
        entry_sample = torch.repeat_interleave(torch.arange(s_rows.numel(), device=device), nnz)
        offset = torch.arange(entry_sample.numel(), device=device) - _exclusive_cumsum(nnz)[entry_sample]
        at = indptr[s_rows][entry_sample] + offset
        return block, _grow(torch.as_tensor(sample_concept, device=device), torch.as_tensor(positive, device=device), entry_sample,
                            indices[at], values[at], value_rank[at], block.size, n_latents, n_chain, dense_cells)

    for block, grown in thread_map(grow, _blocks(entries, parts, block_entries, per_block), jobs):
        at = tree_set[block], tree_concept[block]
        acc0[at], local[at], global_[at], cuts[at] = _scores(grown, removals, levels, exhausted)
        roots[at], depths[at] = grown.root, grown.depth
    return [_result(j if n_sets > 1 else None, acc0[j], local[j], global_[j], roots[j], depths[j], cuts[j], scored, rows, n_rows,
                    removals, levels, exhausted) for j in range(n_sets)]


def _result(code_set: int | None, acc0: np.ndarray, local: np.ndarray, global_: np.ndarray, roots: np.ndarray, depths: np.ndarray,
            cuts: np.ndarray, scored: np.ndarray, rows: list[np.ndarray], n_rows: np.ndarray, removals: tuple[int, ...], levels: str,
            exhausted: str) -> FMSResult:
    """One code set's FMSResult from its trees' statistics (arrays by concept, modified in place: NaN where a concept
    has no root split); `code_set`: its index in the warnings (None: a single set)."""
    where = "fms" if code_set is None else f"fms (code set {code_set})"
    for c in scored:
        if roots[c] < 0:
            logger.warning("%s: concept %d: no latent separates its %d rows (the codes are constant there); scored NaN", where, c, rows[c].size)
            acc0[c] = local[c] = global_[c] = np.nan
            cuts[c] = np.nan
        elif np.isnan(local[c]):
            logger.warning("%s: concept %d: no latent is left to split its rows after the first removal, and removal counts "
                           "without a split are left out (exhausted='drop'); scored NaN", where, c)
    per_concept = acc0 * (local + global_) / 2.0
    valid = ~np.isnan(per_concept)
    score = float(per_concept[valid].mean()) if valid.any() else Undefined("no concept has both classes and a latent that separates them")
    return FMSResult(
        fms=score,
        per_concept=per_concept,
        root_accuracy=acc0,
        local=local,
        global_=global_,
        root_feature=roots,
        depth=depths,
        cut_accuracy=cuts,
        removals=removals,
        levels=levels,
        n_rows=n_rows,
        exhausted=exhausted,
    )
