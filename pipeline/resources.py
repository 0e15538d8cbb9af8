"""What params.yaml names outside itself, checked without loading it: pretrained weights that are not available
offline (a cache lookup, no download) and a real dataset whose file table gives splits too small for the evaluation.

`cedar validate` runs it after the schema (`pipeline.config`); it reads directories and caches, so the stages leave
it to the stage that loads the resource.
"""

from __future__ import annotations

from pipeline.config import Params, split_problems
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
    if isinstance(params.data, FileSettings) and not params.data.on_hub:  # a hub dataset is counted once fetched, by the data stage
        from pipeline.data.sources import split_counts

        try:
            problems += split_problems(split_counts(params.data, params.seed), params)
        except (OSError, ValueError) as e:  # the loaders' LayoutError is a ValueError
            problems.append(f"data.root: {params.data.root}: {str(e).splitlines()[0]}")
    return [f"{source}: {line}" for line in problems]
