"""What params.yaml names outside itself, checked without loading it: pretrained weights that are not available
offline (a cache lookup, no download), a real dataset whose file table gives splits too small for the evaluation
or for a training batch, and training batches beyond a memory budget given as a fraction of this machine's free
RAM (`train.feed_memory` with `train.device: cpu`; a GPU's memory is checked by the stage where it runs).

`cedar validate` runs it after the schema (`pipeline.config`); it reads directories and caches, so the stages leave
it to the stage that loads the resource.
"""

from __future__ import annotations

from pipeline.config import Params, batch_problems, split_problems
from pipeline.data.options import FileSettings
from pipeline.encoders.options import PretrainedSettings


def resource_problems(params: Params, source: str = "params.yaml") -> list[str]:
    """What params name outside this file that is unusable, one line each prefixed by `source`: pretrained weights
    that are neither local nor in the hub cache while offline (a cache lookup, no download), and a real dataset
    whose file table gives splits too small for the evaluation. `cedar validate` runs it; it reads directories and
    caches, so the stages leave it to the stage that loads the resource. The encoders' and the loaders' modules (torch,
    the model libraries) are imported only for the params that name such a resource, so that checking the offline
    default costs no more than reading the schema."""
    problems = []
    if isinstance(params.encoder, PretrainedSettings):
        from pipeline.encoders.registry import unavailable_offline

        problem = unavailable_offline(params.encoder)
        if problem:
            problems.append(problem)
    train_rows = params.train_rows
    if isinstance(params.data, FileSettings) and not params.data.on_hub:  # a hub dataset is counted once fetched, by the data stage
        from pipeline.data.sources import split_counts

        try:
            counts = split_counts(params.data, params.seed)
            problems += split_problems(counts, params)
            train_rows = sum(train for train, _, _ in counts.values())
        except (OSError, ValueError) as e:  # the loaders' LayoutError is a ValueError
            problems.append(f"data.root: {params.data.root}: {str(e).splitlines()[0]}")
    problems += [line for line in feed_problems(params, train_rows) if line not in batch_problems(params, params.train_rows)]
    return [f"{source}: {line}" for line in problems]


def feed_problems(params: Params, train_rows: int | None) -> list[str]:
    """`pipeline.config.batch_problems` with the training split's rows counted here and, for methods trained on the
    CPU (`train.device: cpu`), a `train.feed_memory` fraction resolved against this machine's available RAM. GPU
    memory is not looked at here (that would start torch and the device): the stage checks it where it runs, before
    reading any row (`pipeline.training.feed.plan_feed`)."""
    on_cpu = any(params.train_settings(m).device == "cpu" for m in params.trained_methods())
    return batch_problems(params, train_rows, {"cpu": host_memory()} if on_cpu else None)


def host_memory() -> int:
    """Bytes of RAM available on this machine (what the CPU's `free_memory` is in `pipeline.training.feed`)."""
    import psutil

    return int(psutil.virtual_memory().available)
