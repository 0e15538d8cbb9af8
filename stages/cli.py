"""The `cedar` command: validate params, switch presets, build a smoke variant's inputs, run or serve the Prefect flow,
show a cluster's job script, list runs,
explain an image."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from importlib import resources
from pathlib import Path

from pipeline.paths import Layout
from stages.flow import configure_prefect_env

# The schema (pipeline.config) and the models import torch, seconds of start-up: each command imports what it needs,
# so that `cedar flow` with nothing stale answers as fast as `dvc repro`.


def preset_names() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in resources.files("pipeline.presets").iterdir() if p.name.endswith(".yaml"))


def preset_text(name: str) -> str:
    from pipeline.config import ParamsError

    if name not in preset_names():
        raise ParamsError(f"unknown preset {name!r}; available: {', '.join(preset_names())}")
    return resources.files("pipeline.presets").joinpath(f"{name}.yaml").read_text()


def cmd_validate(args: argparse.Namespace) -> int:
    """The file (`load_params`, what every stage checks), then what it names outside itself (`resource_problems`:
    pretrained weights available offline, a real dataset's splits)."""
    from pipeline.config import ParamsError, load_params
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


def exit_cleanly_on_sigterm() -> None:
    """SIGTERM (a batch system's or `kill`'s stop) ends the flow's process through SystemExit, not the signal's
    default action, so that its exit handlers run: the cluster closes and Prefect's temporary server stops (it is
    a child process, stopped at exit; killed by the bare signal it kept running). Exit status 143 as with the
    signal."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def cmd_flow(args: argparse.Namespace) -> int:
    """Validate params and the cluster, plan from DVC; --dry prints the plan, else the flow runs it (Prefect is
    imported only when there is work: it takes seconds to start). Exit status 1 when a stage failed."""
    from stages.flow.graph import StageError

    try:
        return flow_or_plan(args)
    except StageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def flow_or_plan(args: argparse.Namespace) -> int:
    from stages.flow.cluster import choose_cluster
    from stages.flow.graph import Project, set_params

    if args.retries < 0:
        raise ValueError(f"--retries: expected an int >= 0, got {args.retries}")
    root = args.root.resolve()
    if args.set:
        set_params(root / "params.yaml", args.set)
    choose_cluster(root / args.cluster_file, args.cluster, args.dask)
    project = Project(root)
    try:
        plan = project.plan(args.targets)
    finally:
        project.close()
    if plan:  # bad params fail here, before any work (DVC sees an edited params.yaml as a change)
        from pipeline.config import load_params

        load_params(root / "params.yaml")
    if args.dry:
        for stage in plan:
            print(stage.name)
        return 0
    if not plan:
        print("Data and pipelines are up to date.")
        return 0
    configure_prefect_env(root)
    exit_cleanly_on_sigterm()
    from stages.flow.run import pipeline_flow

    outcome = pipeline_flow(targets=args.targets, cluster=args.cluster, cluster_file=str(args.cluster_file), dask_address=args.dask,
                            retries=args.retries, root=str(root))
    ran = [name for name, status in outcome.items() if status == "ran"]
    print(f"Ran {len(ran)} of {len(outcome)} planned stages; report: {Layout(root).report}")
    return 0


def cmd_cluster_script(args: argparse.Namespace) -> int:
    from stages.flow.cluster import JobqueueSettings, choose_cluster

    cluster = choose_cluster(args.root / args.cluster_file, args.name)
    if not isinstance(cluster, JobqueueSettings):
        raise ValueError(f"cluster {args.name!r} is of kind {cluster.kind!r}: only batch-system clusters (slurm, pbs, lsf, sge, htcondor) submit job scripts")
    print(cluster.job_script())
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from pipeline.config import load_params
    from stages.flow.cluster import choose_cluster

    root = args.root.resolve()
    load_params(root / "params.yaml")
    choose_cluster(root / args.cluster_file, args.cluster, args.dask)
    configure_prefect_env(root)
    exit_cleanly_on_sigterm()
    from stages.flow.run import serve

    parameters = {"targets": args.targets, "overrides": args.set, "cluster": args.cluster, "cluster_file": str(args.cluster_file),
                  "dask_address": args.dask, "retries": args.retries, "root": str(root)}
    serve(args.name, parameters, args.cron, args.interval)
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    from pipeline.config import load_params

    params = load_params(args.params)
    layout = Layout(args.root)
    print(f"{'run':<24} {'latents':>8} {'k':>4} {'FVU':>8} {'L0':>7} {'dead':>6}")
    for cell in params.cells():
        path = layout.run_metrics(cell.name)
        if not path.is_file():
            print(f"{cell.name:<24} {'(not evaluated)':>36}")
            continue
        m = json.loads(path.read_text())
        t = m["trained"]
        print(f"{cell.name:<24} {m['size']:>8} {m['k']:>4} {t['fvu']:>8.4f} {t['l0']:>7.2f} {t['dead_fraction']:>6.3f}")
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
    """Top concepts of one image under a run's model and the caption of its sparse reconstruction.

    The image goes through the same path as the dataset's images (decoded and cropped to the dataset's image size,
    `pipeline.data.images.load_image`) and then through the encoder the encoder stage left (any kind, through
    `pipeline.encoders.registry.open_encoder`)."""
    import numpy as np
    import torch

    from pipeline.config import load_params
    from pipeline.data.dataset import open_dataset
    from pipeline.data.images import load_image
    from pipeline.encoders.registry import open_encoder
    from pipeline.explain.decoder import decode_captions, load_decoder
    from pipeline.explain.naming import dense_explanations, latent_directions, name_latents
    from pipeline.explain.run import latent_labels
    from pipeline.models.checkpoint import load_model
    from pipeline.store import open_store

    params = load_params(args.params)
    layout = Layout(args.root)
    names = [cell.name for cell in params.cells()]
    evaluated = [json.loads(path.read_text()) for name in names if (path := layout.run_metrics(name)).is_file()]
    run = choose_run(names, evaluated, args.run)
    if args.top < 1:
        raise ValueError(f"--top: expected an int >= 1, got {args.top}")
    data = open_dataset(layout.data)
    if not data.has_images:
        raise ValueError(f"{layout.data}: the dataset has no images (its source wrote the embeddings; no encoder to embed {args.image})")
    image = load_image(args.image, int(data.meta["image_size"]))  # an unreadable file fails here, before any model loads
    model_dir = layout.model(run)
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir}: run {run} is not trained yet (run `dvc repro` first)")
    model = load_model(model_dir)
    k = next(cell.k for cell in params.cells() if cell.name == run) if args.k is None else args.k
    if not 1 <= k <= model.n_latents:
        raise ValueError(f"--k: expected 1..{model.n_latents} (the latents of {run}), got {k}")
    x = open_encoder(layout.encoder).encode_images(image[None])  # (1, d)
    if x.shape[1] != model.d:
        raise ValueError(f"{layout.encoder}: the encoder gives d = {x.shape[1]}, but run {run} was trained on d = {model.d}; rerun `dvc repro`")
    decoder = load_decoder(layout.captions)
    codes = model.latents(torch.as_tensor(model.encode(x, k)))[0].numpy()
    labels = latent_labels(model.n_latents, model.signed)
    print(f"image: {args.image} · run {run}{' (best: highest objects MATCHScore)' if args.run is None else ''} · k = {k}")
    if layout.concept_embeddings.exists():
        store = open_store(layout.concept_embeddings)
        texts, embeddings = [str(t) for t in store.attrs["texts"]], store.read()
        text_mean = embeddings.astype(np.float64).mean(axis=0)
        named = name_latents(latent_directions(model), embeddings, texts, top=1, text_mean=text_mean)
        active = np.argsort(-codes, kind="stable")[: int((codes > 0).sum())][: args.top]
        print("top concepts (latent, activation, its best concept and cosine):")
        for i in active:
            print(f"  {labels[i]:>6}  {codes[i]:8.3f}  {named.names[i, 0]} ({named.scores[i, 0]:.2f})")
        if len(active) == 0:
            print("  (no active latent)")
        dense = dense_explanations(x, decoder.input_mean.cpu().numpy(), embeddings, texts, top=min(args.top, len(texts)), text_mean=text_mean)[0]
        print("dense embedding's nearest concepts: " + ", ".join(f"{name} ({score:.2f})" for name, score in dense))
    else:
        print(f"top concepts: unavailable ({layout.concept_embeddings} missing: the encoder has no text tower)")
    sparse = np.asarray(model.decode(model.encode(x, k)), dtype=np.float32)
    sparse_caption, dense_caption = decode_captions(decoder, np.concatenate([sparse, x.astype(np.float32)]))
    print(f"caption (sparse reconstruction, k = {k}): {sparse_caption}")
    print(f"caption (dense embedding): {dense_caption}")
    return 0


def flow_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments `cedar flow` and `cedar serve` share."""
    p.add_argument("targets", nargs="*", metavar="TARGET", help="stages as `dvc repro` takes them: a stage, a cell (sae@topk-256-16), "
                   "a group (sae) or a glob (sae@topk-*); default: all")
    p.add_argument("--cluster", default="local", help="cluster name in the cluster file (default: local)")
    p.add_argument("--cluster-file", type=Path, default=Path("cluster.yaml"), help="relative to --root (default cluster.yaml)")
    p.add_argument("--dask", default=None, metavar="ADDRESS", help="run on this existing Dask scheduler (tcp://host:8786) instead")
    p.add_argument("--retries", type=int, default=2, help="retries of a stage whose command fails or whose worker dies (default 2)")
    p.add_argument("-S", "--set", action="append", default=[], metavar="KEY=VALUE",
                   help="set a params.yaml value first, as `dvc exp run -S` does (repeatable)")
    p.add_argument("--root", type=Path, default=Path("."), help="the DVC project (default: .)")


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
    p = sub.add_parser("flow", help="run the stale DVC stages as a Prefect flow on a Dask cluster (cluster.yaml)")
    flow_arguments(p)
    p.add_argument("--dry", action="store_true", help="print the stages that would run, in order, and exit")
    p.set_defaults(func=cmd_flow)
    p = sub.add_parser("cluster", help="clusters of the cluster file")
    cluster_sub = p.add_subparsers(dest="cluster_command", required=True)
    p = cluster_sub.add_parser("script", help="print the batch job script of a slurm/pbs/lsf/sge/htcondor cluster")
    p.add_argument("name")
    p.add_argument("--cluster-file", type=Path, default=Path("cluster.yaml"), help="relative to --root (default cluster.yaml)")
    p.add_argument("--root", type=Path, default=Path("."))
    p.set_defaults(func=cmd_cluster_script)
    p = sub.add_parser("serve", help="serve the flow as a Prefect deployment (runs from the UI, the CLI or a schedule)")
    flow_arguments(p)
    p.add_argument("--name", default="cedar", help="deployment name (default cedar: cedar-pipeline/cedar)")
    p.add_argument("--cron", default=None, help="also run on this cron schedule")
    p.add_argument("--interval", type=float, default=None, help="also run every this many seconds")
    p.set_defaults(func=cmd_serve)
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
        from pipeline.config import ParamsError
        from pipeline.store import StoreError

        if not isinstance(e, (ParamsError, FileNotFoundError, ValueError, StoreError)):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
