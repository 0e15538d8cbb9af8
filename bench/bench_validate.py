"""`cedar validate` on the default preset: this checkout against an earlier commit, side by side in one run.

    python bench/bench_validate.py [--baseline REF] [--repeats 5]

The baseline is checked out into a temporary git worktree (its `cedar` command was `python -m stages.cli` before the
command got its own package, `python -m cli` after); both run the same params file, alternating, each in a fresh
interpreter, and the script prints the median wall time of each and their ratio. What it measures is start-up: the
modules `cedar validate` imports before it can check a params file.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def command(checkout: Path) -> list[str]:
    module = "cli" if (checkout / "cli" / "__main__.py").is_file() else "stages.cli"
    return [sys.executable, "-m", module, "validate"]


def timed(checkout: Path, params: Path) -> float:
    start = time.perf_counter()
    subprocess.run([*command(checkout), str(params)], cwd=checkout, env={"PYTHONPATH": str(checkout), "PATH": "/usr/bin:/bin"},
                   check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="1b79e4c", help="git ref to compare with (default: the commit before the settings moved)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.baseline], check=True, capture_output=True)
        try:
            params = Path(tmp) / "params.yaml"
            params.write_text((ROOT / "pipeline" / "presets" / "default.yaml").read_text())
            timed(base, params), timed(ROOT, params)  # warm the file cache for both
            now, before = [], []
            for _ in range(args.repeats):
                before.append(timed(base, params))
                now.append(timed(ROOT, params))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=True, capture_output=True)
    b, n = statistics.median(before), statistics.median(now)
    print(f"cedar validate, default preset, median of {args.repeats}: {args.baseline} {b:.2f} s, this checkout {n:.2f} s: {b / n:.1f}x faster")


if __name__ == "__main__":
    main()
