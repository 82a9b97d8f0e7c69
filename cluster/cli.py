"""``fastmode cluster``: render a topology and drive Ray's cluster launcher with it.

    fastmode cluster render TOPOLOGY [--out DIR]   write ray-cluster.yaml and serve-config.yaml
    fastmode cluster up TOPOLOGY [--out DIR]       render, `ray up`, then deploy the application
    fastmode cluster deploy TOPOLOGY [--out DIR]   render and (re)deploy the application only
    fastmode cluster status TOPOLOGY [--out DIR]   `ray status` and `serve status` on the head
    fastmode cluster down TOPOLOGY [--out DIR]     `ray down`: stop and remove every node

Every step is an ordinary ``ray`` command, printed before it runs, so a user can repeat or adapt
any of them by hand. They all go through one ``runner`` (tests inject a fake one).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from .render import DASHBOARD, REMOTE_SERVE_CONFIG, render
from .topology import TopologyError, load_topology

Runner = Callable[..., int]
"""``runner(cmd: list[str], *, quiet: bool = False) -> exit status``."""

_NEXT_TO_PYTHON = Path(sys.executable).with_name("ray")
RAY = str(_NEXT_TO_PYTHON) if _NEXT_TO_PYTHON.exists() else "ray"
"""The ``ray`` command of this environment (the one whose version the nodes install)."""


def run_command(cmd: list[str], *, quiet: bool = False) -> int:
    """Run ``cmd`` in the foreground, echoing it first; ``quiet`` hides its stdout."""
    print("$ " + shlex.join(cmd), flush=True)
    return subprocess.run(cmd, stdout=subprocess.DEVNULL if quiet else None, check=False).returncode


def token_file() -> Path:
    """Ray's token file on this machine; ``file_mounts`` copies it to every node."""
    return Path.home() / ".ray" / "auth_token"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fastmode cluster", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Topology format: cluster/topology.py; examples: cluster/examples/.")
    sub = ap.add_subparsers(dest="action", required=True)
    helps = {"render": "write the Ray cluster launcher config and the Serve config",
             "up": "render, start or update the cluster (ray up), deploy the application",
             "deploy": "render and deploy (or update) the application on a running cluster",
             "status": "show the cluster's nodes and resources and the application's status",
             "down": "tear the cluster down (ray down)"}
    for name, help_ in helps.items():
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("topology", metavar="TOPOLOGY", help="topology YAML (see cluster/examples/)")
        p.add_argument("--out", metavar="DIR", help="where the rendered files go (default: "
                       ".fastmode/cluster/<name> under the working directory)")
    return ap


def main(argv: list[str] | None = None, runner: Runner = run_command) -> int:
    args = _parser().parse_args(argv)
    try:
        topology = load_topology(args.topology)
    except TopologyError as e:
        print(f"fastmode cluster: {e}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path(".fastmode") / "cluster" / topology.name
    cluster, serve = render(topology, out)
    print(f"rendered {cluster}\nrendered {serve}", flush=True)
    steps = _steps(args.action, str(cluster), str(serve))
    if args.action == "up" and not token_file().exists():
        # Token auth stays on: ray start on the nodes uses this token (copied by file_mounts).
        steps.insert(0, ([RAY, "get-auth-token", "--generate"], True))
    for cmd, quiet in steps:
        rc = runner(cmd, quiet=quiet)
        if rc:
            print(f"fastmode cluster: `{shlex.join(cmd)}` failed (exit {rc})", file=sys.stderr)
            return rc
    if args.action in ("up", "deploy"):
        http = topology.app_config.http
        print(f"deploy submitted (`fastmode cluster status {args.topology}` shows when it is RUNNING). "
              f"Reach it through the head node, e.g.\n"
              f"  {RAY} attach {cluster} --port-forward {http.port}"
              f"   # then: curl localhost:{http.port}/health\n"
              f"  {RAY} dashboard {cluster}   # the dashboard, on loopback", flush=True)
    return 0


def _steps(action: str, cluster: str, serve: str) -> list[tuple[list[str], bool]]:
    """The ``ray`` commands of an action, in order, each with whether its stdout is hidden."""
    deploy = [([RAY, "rsync-up", cluster, serve, REMOTE_SERVE_CONFIG], False),
              ([RAY, "exec", cluster, f"serve deploy --address {DASHBOARD} {REMOTE_SERVE_CONFIG}"], False)]
    return {
        "render": [],
        "up": [([RAY, "up", "-y", cluster], False), *deploy],
        "deploy": deploy,
        "status": [([RAY, "exec", cluster, f"ray status && serve status --address {DASHBOARD}"], False)],
        "down": [([RAY, "down", "-y", cluster], False)],
    }[action]


if __name__ == "__main__":
    sys.exit(main())
