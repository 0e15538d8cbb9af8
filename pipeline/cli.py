"""The `cedar` command: validate params, switch presets, run the Prefect flow, list runs."""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path

from pipeline.config import ParamsError, load_params
from pipeline.paths import Layout


def preset_names() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in resources.files("pipeline.presets").iterdir() if p.name.endswith(".yaml"))


def preset_text(name: str) -> str:
    if name not in preset_names():
        raise ParamsError(f"unknown preset {name!r}; available: {', '.join(preset_names())}")
    return resources.files("pipeline.presets").joinpath(f"{name}.yaml").read_text()


def cmd_validate(args: argparse.Namespace) -> int:
    params = load_params(args.params)
    print(f"{args.params}: ok ({len(params.runs())} grid cells, d = {params.d})")
    return 0


def cmd_preset(args: argparse.Namespace) -> int:
    """Write a shipped preset over params.yaml; refuse to overwrite local edits without --force."""
    text = preset_text(args.name)
    target: Path = args.params
    if target.exists() and not args.force:
        current = target.read_text()
        if current != text and current not in {preset_text(n) for n in preset_names()}:
            print(f"error: {target} has local edits (it matches no shipped preset); use --force to overwrite", file=sys.stderr)
            return 2
    target.write_text(text)
    print(f"{target}: now preset {args.name!r}")
    return 0


def cmd_flow(args: argparse.Namespace) -> int:
    load_params(args.params)
    from pipeline.flow import run_flow

    report = run_flow(str(args.params), str(args.root), workers=args.workers, dask_address=args.dask)
    print(report)
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    params = load_params(args.params)
    layout = Layout(args.root)
    print(f"{'run':<24} {'latents':>8} {'k':>4} {'FVU':>8} {'L0':>7} {'dead':>6}")
    for cell in params.runs():
        path = layout.evals / cell.name / "metrics.json"
        if not path.is_file():
            print(f"{cell.name:<24} {'(not evaluated)':>36}")
            continue
        m = json.loads(path.read_text())
        t = m["trained"]
        print(f"{cell.name:<24} {m['size']:>8} {m['k']:>4} {t['fvu']:>8.4f} {t['l0']:>7.2f} {t['dead_fraction']:>6.3f}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cedar", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("validate", help="check params.yaml against the schema")
    p.add_argument("params", nargs="?", type=Path, default=Path("params.yaml"))
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("preset", help="write a shipped preset over params.yaml")
    p.add_argument("name", help="preset name: " + ", ".join(preset_names()))
    p.add_argument("--params", type=Path, default=Path("params.yaml"))
    p.add_argument("--force", action="store_true", help="overwrite local edits")
    p.set_defaults(func=cmd_preset)
    p = sub.add_parser("flow", help="run the whole pipeline as a Prefect flow")
    p.add_argument("--params", type=Path, default=Path("params.yaml"))
    p.add_argument("--root", type=Path, default=Path("."))
    p.add_argument("--workers", type=int, default=1, help="concurrent grid cells on this machine")
    p.add_argument("--dask", default=None, metavar="ADDRESS", help="run tasks on this Dask scheduler (tcp://host:8786)")
    p.set_defaults(func=cmd_flow)
    p = sub.add_parser("runs", help="list trained runs with their headline metrics")
    p.add_argument("--params", type=Path, default=Path("params.yaml"))
    p.add_argument("--root", type=Path, default=Path("."))
    p.set_defaults(func=cmd_runs)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ParamsError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
