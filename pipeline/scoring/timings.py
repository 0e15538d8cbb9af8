"""Where an evaluation's time goes: wall-clock seconds per part, each part timed exclusively (a part timed inside
another is not counted in the outer one).

The parts of one cell's evaluation (`TIMED`): encode (the streamed passes of both models over every row set: codes
written, reconstruction statistics), fvu (the FVU-vs-K curve's extra passes), cknna, probes (fitting the linear probes
and scoring them on each encoded batch), fms, matching (FBMP and one-to-one, in-sample and held out), tapas (TAPAScore
and Delta-stay), explain; total: the whole evaluation, so that the rest (reading code sets, random codes) shows.
On a GPU the parts are measured on the host: a part ends when its results reach the host.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

TIMED = ("encode", "fvu", "cknna", "probes", "fms", "matching", "tapas", "explain")


@dataclass
class Timings:
    """Seconds per part (`TIMED`), accumulated over every `part` of that name."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIMED, 0.0))
    _open: list[list] = field(default_factory=list, repr=False)

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Time the block as `name`; an enclosing part's clock stops meanwhile."""
        if name not in self.seconds:
            raise ValueError(f"timings: unknown part {name!r}; expected one of {list(self.seconds)}")
        now = time.perf_counter()
        if self._open:
            outer = self._open[-1]
            self.seconds[outer[0]] += now - outer[1]
        self._open.append([name, now])
        try:
            yield
        finally:
            now = time.perf_counter()
            inner = self._open.pop()
            self.seconds[inner[0]] += now - inner[1]
            if self._open:
                self._open[-1][1] = now

    def record(self, total: float) -> dict[str, float]:
        """The seconds per part and `total`, rounded to milliseconds (the timings file's content)."""
        return {**{name: round(value, 3) for name, value in self.seconds.items()}, "total": round(total, 3)}
