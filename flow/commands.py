"""The flow's commands of `cedar`: `cedar flow` (run the stale DVC stages as a Prefect flow on a Dask cluster, or
print the plan with --dry), `cedar serve` (the flow as a Prefect deployment), `cedar cluster script` (a batch
system's job script) and `cedar server start|stop|status` (the project's Prefect server, `flow.server`). The
`cedar` command (`cli.main`) adds them to its parser with `add_flow_commands`.

Prefect is imported only when there is work: it takes seconds to start, so `cedar flow` with nothing stale answers
as fast as `dvc repro`.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from flow import configure_prefect_env


def exit_cleanly_on_sigterm() -> None:
    """SIGTERM (a batch system's or `kill`'s stop) ends the flow's process through SystemExit, not the signal's
    default action, so that its exit handlers run: the cluster closes and Prefect's temporary server stops (it is
    a child process, stopped at exit; killed by the bare signal it kept running). Exit status 143 as with the
    signal."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def cmd_flow(args: argparse.Namespace) -> int:
    """Validate params and the cluster, plan from DVC; --dry prints the plan, else the flow runs it (Prefect is
    imported only when there is work: it takes seconds to start). Exit status 1 when a stage failed."""
    from flow.graph import StageError

    try:
        return flow_or_plan(args)
    except StageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def flow_or_plan(args: argparse.Namespace) -> int:
    from flow.cluster import check_submission, choose_cluster
    from flow.graph import Project, set_params

    if args.retries < 0:
        raise ValueError(f"--retries: expected an int >= 0, got {args.retries}")
    root = args.root.resolve()
    if args.set:
        set_params(root / "params.yaml", args.set)
    cluster = choose_cluster(root / args.cluster_file, args.cluster, args.dask)
    note = check_submission(cluster, f"{args.cluster_file}: {args.cluster}", required=not args.dry)
    if note:
        print(f"note: {note}", file=sys.stderr)
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
    from flow.server import choose_api

    configure_prefect_env(root)
    exit_cleanly_on_sigterm()
    try:
        choose_api(root, len(plan))
    except RuntimeError as e:
        raise ValueError(str(e)) from None
    from flow.prefect_flow import pipeline_flow, prefect_settings, summary

    with prefect_settings():
        outcome = pipeline_flow(targets=args.targets, cluster=args.cluster, cluster_file=str(args.cluster_file), dask_address=args.dask,
                                retries=args.retries, root=str(root))
    print(summary(outcome, root))
    return 0


def cmd_cluster_script(args: argparse.Namespace) -> int:
    """The job script of cluster NAME, by default the cluster file's first batch-system entry."""
    from flow.cluster import JobqueueSettings, choose_cluster, default_batch_cluster

    path = args.root / args.cluster_file
    name = args.name if args.name is not None else default_batch_cluster(path)
    cluster = choose_cluster(path, name)
    if not isinstance(cluster, JobqueueSettings):
        raise ValueError(f"cluster {name!r} is of kind {cluster.kind!r}: only batch-system clusters (slurm, pbs, lsf, sge, htcondor) submit job scripts")
    print(cluster.job_script(args.root.resolve()))
    return 0


def cmd_server(args: argparse.Namespace) -> int:
    """`cedar server start|stop|status`: the project's Prefect server (flow.server)."""
    from flow.server import project_server, start_project_server, stop_project_server

    root = args.root.resolve()
    if args.action == "start":
        url = start_project_server(root)
        print(f"Prefect server of {root}: {url.removesuffix('/api')} (API {url}); flows of this project report to it until `cedar server stop`")
    elif args.action == "stop":
        print("stopped" if stop_project_server(root) else "no Prefect server of this project was running")
    else:
        url = project_server(root)
        print(f"running: {url.removesuffix('/api')} (API {url})" if url else "not running")
        return 0 if url else 3
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from flow.cluster import check_submission, choose_cluster
    from pipeline.config import load_params

    root = args.root.resolve()
    load_params(root / "params.yaml")
    cluster = choose_cluster(root / args.cluster_file, args.cluster, args.dask)
    check_submission(cluster, f"{args.cluster_file}: {args.cluster}", required=True)
    configure_prefect_env(root)
    exit_cleanly_on_sigterm()
    from flow.prefect_flow import prefect_settings, serve

    parameters = {"targets": args.targets, "overrides": args.set, "cluster": args.cluster, "cluster_file": str(args.cluster_file),
                  "dask_address": args.dask, "retries": args.retries, "root": str(root)}
    with prefect_settings():
        serve(args.name, parameters, args.cron, args.interval)
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


def add_flow_commands(sub: argparse._SubParsersAction) -> None:
    """Add `flow`, `cluster script` and `serve` to the `cedar` command's subparsers."""
    p = sub.add_parser("flow", help="run the stale DVC stages as a Prefect flow on a Dask cluster (cluster.yaml)")
    flow_arguments(p)
    p.add_argument("--dry", action="store_true", help="print the stages that would run, in order, and exit")
    p.set_defaults(func=cmd_flow)
    p = sub.add_parser("cluster", help="clusters of the cluster file")
    cluster_sub = p.add_subparsers(dest="cluster_command", required=True)
    p = cluster_sub.add_parser("script", help="print the batch job script of a slurm/pbs/lsf/sge/htcondor cluster")
    p.add_argument("name", nargs="?", default=None, help="a cluster of the file (default: its first batch-system entry)")
    p.add_argument("--cluster-file", type=Path, default=Path("cluster.yaml"), help="relative to --root (default cluster.yaml)")
    p.add_argument("--root", type=Path, default=Path("."))
    p.set_defaults(func=cmd_cluster_script)
    p = sub.add_parser("serve", help="serve the flow as a Prefect deployment (runs from the UI, the CLI or a schedule)")
    flow_arguments(p)
    p.add_argument("--name", default="cedar", help="deployment name (default cedar: cedar-pipeline/cedar)")
    p.add_argument("--cron", default=None, help="also run on this cron schedule")
    p.add_argument("--interval", type=float, default=None, help="also run every this many seconds")
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser("server", help="this project's Prefect server (large flows start it; it keeps running for later flows)")
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--root", type=Path, default=Path("."), help="the project (default: .); its server's database is in .prefect/")
    p.set_defaults(func=cmd_server)
