"""Imported at start-up by every Python process of a test's `dvc repro` whose PYTHONPATH names this folder
(tests/test_reliability.py): a fault-injection point that makes a kill during training deterministic.

Once the training of the run named by CEDAR_TEST_PAUSE_RUN has written an epoch checkpoint (the write has returned:
the checkpoint is whole on disk), the writing thread creates the file CEDAR_TEST_PAUSE_FLAG and sleeps; the
training blocks at its next wait for that thread, so the test can kill the run there. Without the hook, a tiny
preset's training lasts a few hundredths of a second and a kill cannot be aimed inside it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import time
from pathlib import Path

MODULE = "pipeline.training.resume"


class _PauseAfterCheckpoint(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def patched(module) -> None:
            exec_module(module)
            write = module.write_snapshot

            def write_then_pause(directory: Path, snap, fingerprint: str) -> None:
                write(directory, snap, fingerprint)
                if f"{os.environ['CEDAR_TEST_PAUSE_RUN']}.tmp" in (directory.name, directory.parent.name):  # (an lr axis: lr-<i>)
                    Path(os.environ["CEDAR_TEST_PAUSE_FLAG"]).touch()
                    time.sleep(3600)

            module.write_snapshot = write_then_pause

        spec.loader.exec_module = patched
        return spec


if os.environ.get("CEDAR_TEST_PAUSE_RUN"):
    sys.meta_path.insert(0, _PauseAfterCheckpoint())
