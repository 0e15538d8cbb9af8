"""The `cedar` command: validate params, switch presets, build a smoke variant's inputs, list runs, explain an image;
and the flow's commands (`flow`, `serve`, `cluster script`, from `flow.commands`).

The schema (`pipeline.config`) is light; the models, encoders and Prefect take seconds to import: each command
imports what it needs, so `cedar validate` and `cedar flow` with nothing stale answer at once.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from flow.commands import add_flow_commands
from pipeline.config import ParamsError, load_params
from pipeline.paths import Layout
from pipeline.presets import preset_names, preset_text


def cmd_validate(args: argparse.Namespace) -> int:
    """The file (`load_params`, what every stage checks), then what it names outside itself (`resource_problems`:
    pretrained weights available offline, a real dataset's splits)."""
    from pipeline.resources import resource_problems

    params = load_params(args.params)
    problems = resource_problems(params, str(args.params))
    if problems:
        raise ParamsError("\n".join(problems))
    print(f"{args.params}: ok ({len(params.cells())} grid cells, d = {params.d})")
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


#: the real-model presets with a smoke variant: their stand-in dataset (`pipeline.data.smoke`), its folder under the
#: smoke directory, and the open_clip architecture whose random weights the variant loads (the paths its preset names)
SMOKE = {"clip-imagenet": ("folders", "imagenet", "ViT-B-32"), "syncub": ("syncub", "syncub", "ViT-B-16"),
         "syncoco": ("syncoco", "syncoco", "ViT-B-16")}


def cmd_smoke(args: argparse.Namespace) -> int:
    """Write the offline inputs of preset NAME's smoke variant (64 images in its loader's layout and random weights of
    its architecture, under smoke/ beside params.yaml; kept if already there), then that variant as params.yaml."""
    from pipeline.data.smoke import WRITERS
    from pipeline.encoders.openclip import save_random_weights

    if args.name not in SMOKE:
        raise ValueError(f"no smoke variant of {args.name!r}; available: {', '.join(SMOKE)}")
    writer, folder, arch = SMOKE[args.name]
    smoke = args.params.resolve().parent / "smoke"
    if not (smoke / folder).exists():
        WRITERS[writer](smoke / folder)
    weights = save_random_weights(arch, smoke / f"{arch}-random.safetensors")
    print(f"{smoke / folder}: 64 images in the {writer} layout; {weights}: random {arch} weights")
    return cmd_preset(argparse.Namespace(name=f"{args.name}-smoke", params=args.params, force=args.force))


def seconds(path: Path, *keys: str) -> str:
    """A duration from a timings file (`keys` into its JSON) for a table cell: "12.3s", or "-" when not recorded."""
    try:
        value: Any = json.loads(path.read_text())
        for key in keys:
            value = value[key]
        return f"{float(value):.1f}s"
    except (OSError, ValueError, KeyError, TypeError):
        return "-"


def cmd_runs(args: argparse.Namespace) -> int:
    """Each run's reconstruction numbers and the wall-clock seconds of its last training and evaluation (the
    timings files beside the records: not in the report, whose bytes must not change from run to run)."""
    params = load_params(args.params)
    layout = Layout(args.root)
    print(f"{'run':<24} {'latents':>8} {'k':>4} {'FVU':>8} {'L0':>7} {'dead':>6} {'train':>9} {'evaluate':>9}")
    for cell in params.cells():
        path = layout.run_metrics(cell.name)
        if not path.is_file():
            print(f"{cell.name:<24} {'(not evaluated)':>36}")
            continue
        m = json.loads(path.read_text())
        t = m["trained"]
        train, evaluate = seconds(layout.model_timings(cell.name), "seconds", "total"), seconds(layout.run_timings(cell.name), "total")
        print(f"{cell.name:<24} {m['size']:>8} {m['k']:>4} {t['fvu']:>8.4f} {t['l0']:>7.2f} {t['dead_fraction']:>6.3f} {train:>9} {evaluate:>9}")
    return 0


def choose_run(names: list[str], evaluated: list[dict], requested: str | None) -> str:
    """The run to explain: `requested` if it is one of the grid's `names`, else the best evaluated run
    (highest objects MATCHScore, `pipeline.report.tables.best_run`). One-line errors otherwise."""
    from pipeline.report.tables import best_run

    if requested is not None:
        if requested not in names:
            raise ValueError(f"unknown run {requested!r}; known runs: {', '.join(names)}")
        return requested
    if not evaluated:
        raise FileNotFoundError("no evaluated run under store/eval (run `dvc repro` first, or name one with --run)")
    return best_run(evaluated)


def cmd_explain(args: argparse.Namespace) -> int:
    """Top concepts of one image under a run's model and the captions of its sparse reconstruction and of its dense
    embedding (`pipeline.explain.image.explain_image`); the run is --run or the best evaluated one."""
    from pipeline.explain.image import explain_image

    params = load_params(args.params)
    layout = Layout(args.root)
    cells = {cell.name: cell for cell in params.cells()}
    evaluated = [json.loads(path.read_text()) for name in cells if (path := layout.run_metrics(name)).is_file()]
    run = choose_run(list(cells), evaluated, args.run)
    found = explain_image(layout, run, args.image, args.k, cells[run].k, args.top)
    print(f"image: {args.image} · run {run}{' (best: highest objects MATCHScore)' if args.run is None else ''} · k = {found.k}")
    if found.concepts is None:
        print(f"top concepts: unavailable ({found.no_concepts})")
    else:
        print("top concepts (latent, activation, its best concept and cosine):")
        for c in found.concepts:
            print(f"  {c.latent:>6}  {c.activation:8.3f}  {c.concept} ({c.cosine:.2f})")
        if not found.concepts:
            print("  (no active latent)")
        print("dense embedding's nearest concepts: " + ", ".join(f"{name} ({score:.2f})" for name, score in found.dense_concepts or ()))
    print(f"caption (sparse reconstruction, k = {found.k}): {found.sparse_caption}")
    print(f"caption (dense embedding): {found.dense_caption}")
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
    p = sub.add_parser("smoke", help="write a real-model preset's offline smoke inputs and its smoke variant as params.yaml")
    p.add_argument("name", help="preset name: " + ", ".join(SMOKE))
    p.add_argument("--params", type=Path, default=Path("params.yaml"))
    p.add_argument("--force", action="store_true", help="overwrite local edits of params.yaml")
    p.set_defaults(func=cmd_smoke)
    add_flow_commands(sub)
    p = sub.add_parser("runs", help="list trained runs with their headline metrics")
    p.add_argument("--params", type=Path, default=Path("params.yaml"))
    p.add_argument("--root", type=Path, default=Path("."))
    p.set_defaults(func=cmd_runs)
    p = sub.add_parser("explain", help="an image's top concepts and caption under a run's model")
    p.add_argument("image", type=Path, help="a PNG or JPEG file")
    p.add_argument("--run", default=None, help="a run name (see `cedar runs`); default: the best evaluated run")
    p.add_argument("--k", type=int, default=None, help="active latents of the sparse reconstruction (default: the run's k)")
    p.add_argument("--top", type=int, default=5, help="concepts to print (default 5)")
    p.add_argument("--params", type=Path, default=Path("params.yaml"))
    p.add_argument("--root", type=Path, default=Path("."))
    p.set_defaults(func=cmd_explain)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except Exception as e:
        from pipeline.store import StoreError  # zarr: imported only once a command has failed

        if not isinstance(e, (ParamsError, FileNotFoundError, ValueError, StoreError)):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
