"""The ``fastmode`` command: one entry point, one subcommand per owner module.

Subcommands are imported lazily, so ``fastmode --help`` stays fast and a subcommand's heavy
dependencies (vLLM, Ray) load only when it runs.
"""

from __future__ import annotations

import importlib
import sys

# name -> ("module:function", one-line help). Each function takes argv (list[str]) and returns an exit code.
COMMANDS: dict[str, tuple[str, str]] = {
    "up": ("serve.up:main", "run every lane, the router and HTTP on Ray Serve until Ctrl-C"),
    "grpc-chat": ("clients.grpc_chat:main", "stream a completion over the gRPC API"),
    "demo": ("clients.demo:main", "generate with both shipped models, without serving"),
    "eval": ("models.eval.run:main", "quality eval: bits per byte, next-line exact match, agreement"),
    "distill": ("models.distill.run:main", "make the fast model from the full one (the shipped models/fast)"),
    "plan": ("sharding.planner:main", "choose tp x pp for a model on a kind of chip; predict tokens/s"),
    "chat": ("clients.chat:main", "stream a completion to the terminal; ends with time to first token and tokens/s"),
    "trace": ("clients.trace_report:main",
              "per-hop cost table, chip-to-chip heatmap and step waterfall from exported spans"),
    "bench": ("bench.cli:main", "benchmarks: lanes under load, quality against speed"),
    "cluster": ("cluster.cli:main", "render a cluster topology; ray up / down / status it and deploy the app"),
}


def usage() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = ["usage: fastmode COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `fastmode COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"fastmode: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module, func = COMMANDS[name][0].split(":")
    fn = getattr(importlib.import_module(module), func)
    return int(fn(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
