"""The DVC side of the flow: which stages are stale, in what order, and recording a finished stage in dvc.lock.

Everything goes through DVC's own Python API (`dvc.repo.Repo`), so "stale" means exactly what it means to
`dvc status` and `dvc repro`: the same stage graph (dvc.yaml with its `matrix:` cells expanded), the same hashes
of deps, params and outs, the same lock file. Targets are collected like `dvc repro TARGET...` (a stage, a matrix
cell such as `sae@topk-256-16`, a group such as `sae`, or a glob such as `sae@topk-*`) and planned like it
(the targets and their upstream stages, in DVC's post-order).

The plan holds every stage that is changed now plus every planned stage downstream of one (its inputs will
change when the upstream one reruns): what `dvc repro` would run if every rerun changed its outputs. When a
planned stage's turn comes, `Project.start` asks DVC again, so a stage whose upstream reran with identical
outputs is skipped, as `dvc repro` skips it.

Running a stage is split the way `dvc repro` splits it (dvc.stage.Stage.run), so that only this process, the
flow's driver, ever touches DVC's state: `start` removes the stage's outputs (persistent ones are kept, as
DVC keeps them) or restores them from DVC's run cache; the stage's commands then run anywhere (a Dask worker);
`record` checks that every output exists, hashes outputs and deps, commits outputs to the cache and writes the
stage's entry in dvc.lock. Stages that finish while another is being recorded are recorded together, with one
rewrite of dvc.lock (DVC rewrites the whole file for every stage, which grows with the number of stages).
All of it happens under DVC's repository lock, and under a thread lock, since the flow's tasks are threads.
"""

from __future__ import annotations

import os
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class StageError(RuntimeError):
    """A stage cannot be recorded (missing outputs) or DVC refused an operation; one line naming the stage."""


@dataclass(frozen=True)
class PlannedStage:
    """One stage of the plan. needs: the planned stages it waits for (names); commands: its dvc.yaml `cmd` lines,
    run in `wdir` (absolute); resources: the Dask worker resources it asks for (dvc.yaml `meta: {resources: ...}`, e.g. {"GPU": 1})."""

    name: str
    needs: tuple[str, ...]
    commands: tuple[str, ...]
    wdir: str
    resources: dict[str, float] = field(default_factory=dict)


class Project:
    """A DVC project (the directory holding dvc.yaml) as the flow's driver sees it: plan, start, record.

    DVC's API expects to run from the project, as the `dvc` command does (its run cache, for one, places stages
    relative to the working directory): opening a Project makes `root` the working directory of the process.
    Thread-safe: every DVC call holds one thread lock and DVC's repository lock (`.dvc/tmp/lock`)."""

    def __init__(self, root: Path):
        from dvc.exceptions import NotDvcRepoError
        from dvc.repo import Repo

        os.chdir(root)
        try:
            self.repo = Repo(str(root))
        except NotDvcRepoError:
            raise StageError(f"{root}: not a DVC project (no .dvc/ directory); run `dvc init` first") from None
        self.root = Path(self.repo.root_dir)
        self._stages: dict[str, Any] = {}
        self._lock = threading.Lock()  # held for every DVC call
        self._queue_lock = threading.Lock()  # held only to add to or take the queue
        self._queue: list[str] = []  # finished stages waiting to be recorded
        self._outcome: dict[str, str | None] = {}  # recorded stage -> None, or why it was not recorded
        self.commands_ran: set[str] = set()  # stages whose command ran in this flow (a retried task's earlier attempt too)
        self.in_flight: dict[str, Any] = {}  # stage -> the Dask future of its command, until a task's attempt has its result

    def _locked(self):
        from dvc.repo import lock_repo

        return lock_repo(self.repo)

    def plan(self, targets: list[str] | None = None) -> list[PlannedStage]:
        """The stages `dvc repro TARGETS` could run, stale or downstream of a stale one, in DVC's order.

        Targets as `dvc repro --glob` takes them (default: every stage of dvc.yaml); frozen stages never run."""
        from dvc.exceptions import DvcException
        from dvc.repo.reproduce import collect_stages, get_active_graph, plan_repro

        with self._lock, self._locked():
            try:
                chosen = collect_stages(self.repo, [self._target(t) for t in targets or ["dvc.yaml"]], glob=True)
            except DvcException as e:
                raise StageError(f"targets {' '.join(targets or [])}: {e}") from None
            if targets and not chosen:
                raise StageError(f"no stage matches {' '.join(targets)} (see `dvc stage list`)")
            graph = get_active_graph(self.repo.index.graph)
            stale: dict[str, tuple[str, ...]] = {}
            order = plan_repro(graph, chosen)
            for stage in order:
                upstream = tuple(self.name(s) for s in graph.successors(stage) if self.name(s) in stale)
                if not stage.frozen and (upstream or stage.changed()):
                    stale[self.name(stage)] = upstream
            self._stages = {self.name(s): s for s in order}
        return [PlannedStage(name, needs, tuple(_commands(self._stages[name])), self._stages[name].wdir, _resources(self._stages[name]))
                for name, needs in stale.items()]

    def _target(self, target: str) -> str:
        """A target as `dvc repro` in the project's root takes it (stage names are looked up in its dvc.yaml)."""
        if ":" in target or Path(target).name.endswith((".yaml", ".dvc")) or os.sep in target.split("@")[0]:
            return str(self.root / target)
        return f"{self.root / 'dvc.yaml'}:{target}"

    def name(self, stage: Any) -> str:
        """A stage's name as `dvc repro` in the project's root prints it: `sae@topk-32-4`, or `sub/dvc.yaml:name`."""
        dvcfile = Path(stage.dvcfile.path)
        return stage.name if dvcfile == self.root / "dvc.yaml" else f"{dvcfile.relative_to(self.root).as_posix()}:{stage.name}"

    def start(self, name: str) -> str:
        """Before `name`'s command runs, as `dvc repro` does: "unchanged" when DVC finds it up to date now (skip
        it); "restored" when its outputs came back from DVC's run cache (recorded, nothing to run); else "run",
        after removing its outputs (persistent ones stay, unprotected)."""
        from dvc.stage.cache import RunCacheNotFoundError

        stage = self._stages[name]
        with self._lock, self._locked():
            if not stage.changed():
                return "unchanged"
            stage.remove_outs(ignore_remove=False, force=False)
            try:
                stage.repo.stage_cache.restore(stage)
            except RunCacheNotFoundError:
                stage.save_deps()
                # Its outputs' hashes still describe the last run (dvc.lock's): with the deps now saved, a retried
                # attempt's restore would take them for this run's and check the old outputs out (seen: a flow that
                # lost its Prefect API recorded seed-0 outputs under seed 1 and `dvc status` called them up to date).
                for out in stage.outs:
                    out.clear()
                return "run"
        self.record(name)
        return "restored"

    def record(self, name: str) -> None:
        """Record finished stage `name` in dvc.lock, with every other stage that finished meanwhile (one rewrite).

        Raises StageError, writing nothing for `name`, when one of its outputs is missing."""
        with self._queue_lock:
            self._queue.append(name)
        with self._lock:
            if name not in self._outcome:  # else another thread recorded it in its batch
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                with self._locked():
                    outcome = self._record([self._stages[n] for n in batch])
                self._outcome.update({self.name(stage): problem for stage, problem in outcome.items()})
            problem = self._outcome.pop(name, "it was never queued")
        if problem:
            raise StageError(f"{name}: not recorded in dvc.lock: {problem}")

    @staticmethod
    def _record(stages: list[Any]) -> dict[Any, str | None]:
        """Hash, cache and lock every stage whose outputs all exist (one dvc.lock rewrite); the others' problems."""
        from dvc.exceptions import DvcException

        done, outcome = [], {}
        for stage in stages:
            absent = [str(out) for out in stage.outs if not out.exists]
            if absent:
                outcome[stage] = f"its command left no {', '.join(absent)}"
                continue
            try:
                stage.save(run_cache=_run_cacheable(stage))
                stage.commit()
            except DvcException as e:
                outcome[stage] = str(e)
                continue
            done.append(stage)
        if done:
            try:
                done[0].dvcfile.dump_stages(done, update_pipeline=False)
            except DvcException as e:
                return outcome | dict.fromkeys(done, str(e))
        return outcome | dict.fromkeys(done, None)

    def close(self) -> None:
        self.repo.close()


def _commands(stage: Any) -> list[str]:
    """A stage's `cmd`: one command or a list of them, run in order (as DVC does)."""
    return list(stage.cmd) if isinstance(stage.cmd, list) else [stage.cmd]


def _resources(stage: Any) -> dict[str, float]:
    """The Dask worker resources a stage asks for in dvc.yaml (`meta: {resources: {GPU: 1}}`); {} when none."""
    resources = (stage.meta or {}).get("resources") or {}
    if not isinstance(resources, dict) or not all(isinstance(v, (int, float)) and v > 0 for v in resources.values()):
        raise StageError(f"{stage.dvcfile.relpath}: {stage.name}: meta.resources: expected a mapping of names to positive numbers, got {resources!r}")
    return {str(k): float(v) for k, v in resources.items()}


def _run_cacheable(stage: Any) -> bool:
    """Whether `dvc repro` would save this run to DVC's run cache (not when an output other than metrics/plots
    is uncached): the same rule as dvc.stage.Stage.run."""
    return not any(not out.use_cache for out in stage.outs if not (out.is_metric or out.is_plot))


def set_params(path: Path, overrides: list[str]) -> None:
    """Apply `-S key=value` overrides to the params file at `path` as `dvc exp run -S` does (DVC's Hydra override
    grammar: `key=value`, `+key=value` adds, `~key` deletes), after checking the result against the params schema;
    a bad override changes nothing."""
    from dvc.exceptions import InvalidArgumentError
    from dvc.utils.hydra import apply_overrides

    from pipeline.config import validate_params  # the schema imports torch: only when there are overrides

    path = Path(path)
    handle, name = tempfile.mkstemp(suffix=".yaml", dir=path.parent, prefix=".params-")
    os.close(handle)
    trial = Path(name)
    try:
        trial.write_text(path.read_text())
        try:
            apply_overrides(trial, overrides)
        except InvalidArgumentError as e:
            raise StageError(f"-S {' '.join(overrides)}: {e.__cause__ or e}") from None
        validate_params(yaml.safe_load(trial.read_text()), f"{path} (with -S {' '.join(overrides)})")
        os.replace(trial, path)
    finally:
        trial.unlink(missing_ok=True)
