"""``fastmode up``: run the whole application (all lanes, router, HTTP) until Ctrl-C.

Without ``--address`` it starts a local Ray instance whose chips are this machine's cores and
stops it again on exit; with ``--address`` it joins a running cluster and, on exit, deletes only
the application it deployed. ``--print-serve-config`` writes the equivalent ``serve deploy`` file
for a cluster that already runs Ray. Beyond loopback it refuses to start without API keys unless
``--insecure-no-auth`` (``serve.auth``); with ``http.tls_*`` it serves https and wss (docs/security.md).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path

import yaml

from models.builtin import PREFIX as BUILTIN_PREFIX
from sharding import cpus

from .auth import insecure_warning, load_keys
from .config import AppConfig, dump_config, load_config
from .errors import ConfigError
from .preflight import preflight


def http_options(config: AppConfig) -> dict:
    """Ray Serve's ``http_options``: its proxy's bind and, with ``http.tls_*``, its certificate."""
    http = config.http
    options = {"host": http.host, "port": http.port}
    if http.tls:
        options |= {"ssl_certfile": http.tls_certfile, "ssl_keyfile": http.tls_keyfile}
    return options


def serve_config(config: AppConfig) -> dict:
    """The ``serve deploy`` / ``serve run`` config that deploys the same application."""
    return {
        # http.server 'gateway': the gateway replica listens on the port itself, so no Serve proxy.
        "proxy_location": "HeadOnly" if config.http.server == "serve" else "Disabled",
        "http_options": http_options(config),
        "logging_config": {"log_level": "INFO", "enable_access_log": False},
        "applications": [{
            "name": config.name, "route_prefix": "/", "import_path": "serve.app:build_app",
            "args": {"config": config.model_dump(mode="json")},
        }],
    }


def port_free(host: str, port: int) -> None:
    """Raise ``OSError`` (with a readable ``strerror``) if ``host:port`` cannot be listened on."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            raise OSError(e.errno, f"{host}:{port} is in use ({e.strerror})") from e


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fastmode up", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", metavar="FILE", help="deployment YAML (default: the built-in defaults, "
                    "which serve the shipped models; see serve/fastmode.yaml)")
    ap.add_argument("--full", metavar="PATH", help="the full model: a checkpoint directory, a GGUF file or "
                    "builtin:NAME (overrides models.full.path; its id stays models.full.id)")
    ap.add_argument("--fast", metavar="PATH", help="the fast model, likewise, or a student folder of fastmode "
                    "distill made from the full model (overrides models.fast.path)")
    ap.add_argument("--address", help="join this Ray cluster instead of starting one (or set RAY_ADDRESS)")
    ap.add_argument("--host", help="HTTP bind address (overrides http.host)")
    ap.add_argument("--port", type=int, help="HTTP port (overrides http.port)")
    ap.add_argument("--grpc-port", type=int, help="gRPC port (overrides grpc.port)")
    ap.add_argument("--metrics-port", type=int, help="Prometheus port of a local Ray (overrides http.metrics_port)")
    ap.add_argument("--chips", type=int, default=os.cpu_count() or 1,
                    help="`chip` resources of a locally started Ray (default: CPU cores, %(default)s here)")
    ap.add_argument("--print-config", action="store_true", help="print the effective config and exit")
    ap.add_argument("--print-serve-config", action="store_true",
                    help="print the equivalent `serve deploy` config and exit")
    ap.add_argument("--insecure-no-auth", action="store_true", help="serve a non-loopback http.host or grpc.host "
                    "without API keys: anyone who reaches the port may use it (sets auth.allow_public_without_keys)")
    ap.add_argument("--verbose", action="store_true", help="keep vLLM's and Serve's info logs")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = load_config(args.config)
        if args.full or args.fast:
            models = config.models.model_dump(mode="json")
            for key in ("full", "fast"):
                value = getattr(args, key)
                if value:
                    models[key]["path"] = value if value.startswith(BUILTIN_PREFIX) else str(Path(value).expanduser().resolve())
            config = load_config(config.model_dump(mode="json") | {"models": models})
        preflight(config, chips=args.chips)  # every model against every lane that runs it, before Ray starts
        http = {k: v for k, v in (("host", args.host), ("port", args.port), ("metrics_port", args.metrics_port))
                if v is not None}
        if http:
            config = load_config(config.model_dump(mode="json") | {"http": config.http.model_dump() | http})
        if args.grpc_port is not None:
            config = load_config(config.model_dump(mode="json") | {"grpc": config.grpc.model_dump() | {"port": args.grpc_port}})
        if args.insecure_no_auth:
            config = load_config(config.model_dump(mode="json") | {
                "auth": config.auth.model_dump() | {"allow_public_without_keys": True}})
        keys = load_keys(config)  # refuse a non-loopback bind without keys before starting anything
    except ConfigError as e:  # PreflightError included
        print(f"fastmode up: {e}", file=sys.stderr)
        return 2
    if warning := insecure_warning(config, keys):
        line = "!" * 100
        print(f"{line}\nfastmode up: {warning}\n{line}", file=sys.stderr, flush=True)
    if args.print_config:
        print(dump_config(config), end="")
        return 0
    if args.print_serve_config:
        print(yaml.safe_dump(serve_config(config), sort_keys=False), end="")
        return 0
    if not (args.address or os.environ.get("RAY_ADDRESS")):
        try:  # a local start: say so now, not after a minute of loading engines
            port_free(config.http.host, config.http.port)
            if config.grpc.enabled:
                port_free(config.grpc.host, config.grpc.port)
        except OSError as e:
            print(f"fastmode up: {e.strerror} (stop what uses it, or choose another port)", file=sys.stderr)
            return 2
    return run(config, address=args.address or os.environ.get("RAY_ADDRESS"), chips=args.chips,
               verbose=args.verbose)


def run(config: AppConfig, *, address: str | None, chips: int, verbose: bool = False) -> int:
    """Deploy ``config`` and block until SIGINT/SIGTERM; then tear down what was started."""
    import ray
    from ray import serve

    from .app import build
    from .gateway import PLAYGROUND

    if not verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    started = time.perf_counter()
    print(f"fastmode up: starting Ray ({'joining ' + address if address else f'local, {chips} chips'})",
          flush=True)
    if address:
        ray.init(address=address, include_dashboard=False, log_to_driver=verbose)
    else:
        # Ray's daemons and workers start on every CPU (so do the engines and chips while they load and
        # compile); once the application is ready, the daemons go to the serving cores (below).
        ray.init(address="local", resources={"chip": chips}, include_dashboard=False, log_to_driver=verbose,
                 _metrics_export_port=config.http.metrics_port)
    # After ray.init, which installs its own SIGTERM handler. SIGINT is set too because a shell
    # starts background jobs with SIGINT ignored, and Python then leaves it ignored.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    http, ws = ("https", "wss") if config.http.tls else ("http", "ws")
    base = f"{http}://{config.http.host}:{config.http.port}"
    try:
        # root_url: what Serve's own "is ready at" line says (it would say http:// with TLS too).
        serve.start(proxy_location="HeadOnly" if config.http.server == "serve" else "Disabled",
                    http_options=http_options(config) | {"root_url": base},
                    logging_config={"log_level": "INFO" if verbose else "WARNING", "enable_access_log": verbose})
        print(f"fastmode up: deploying: {DEPLOYING}", flush=True)
        try:
            serve.run(build(config), name=config.name, route_prefix="/")  # lanes are up once warmed up
        except RuntimeError as e:  # a deployment's replicas kept failing: say which, and why
            print(f"fastmode up: the application did not deploy: {e}\n{deploy_failures(config.name)}"
                  f"(full tracebacks: {_ray_logs()}/serve/)", file=sys.stderr, flush=True)
            return 1
        if not serve.get_deployment_handle("gateway", config.name).wait_ready.remote().result():
            print("fastmode up: the gateway did not reach every lane within 10 minutes; see /health",
                  file=sys.stderr, flush=True)
        fast = serve.get_deployment_handle("fast-lane", config.name)
        layout = fast.stats.remote().result()["layout"]
        # One fast-lane replica's door (GET /v1/door lists them all); it moves when a ring is rebuilt.
        door = (fast.link_address.remote().result().get("head") or {}).get("door") if config.door_on() else None
        if not address:  # Ray's daemons, idle workers, Serve's controller and this process: serving cores
            cpus.place_daemons(os.getpid(), config.cpus)
        m = config.models
        compiling = _exact_compiling(config)
        print(f"fastmode up: ready in {time.perf_counter() - started:.0f} s"
              + (f" ({COMPILING})" if compiling else "") + "\n"
              f"  page     {base}{PLAYGROUND}/   (playground: race one prompt on every tier, in a browser)\n"
              f"  WS       {ws}{base[len(http):]}/v1/responses   (persistent WebSocket, docs/protocol.md)\n"
              + (f"  door     ws://{door['host']}:{door['port']}/v1/responses   ({m.fast.id} from its ring's head "
                 "chip itself; GET /v1/door)\n" if door else "") +
              f"  HTTP     {base}/v1   (OpenAI API: chat/completions, completions, models)\n"
              f"           {base}/health   {base}/v1/generate (NDJSON)\n"
              + ("" if address else f"  metrics  http://127.0.0.1:{config.http.metrics_port}/metrics   (Prometheus)\n")
              + (f"  gRPC     {config.grpc.host}:{config.grpc.port}   ({'TLS, ' if config.grpc.tls else ''}"
                 "fastmode.v1.Inference, health, reflection)\n" if config.grpc.enabled else "") +
              f"  models   {m.full.id} (lanes: standard; service_tier=priority: priority; "
              f"service_tier=exact: exact, k={config.lanes.exact.num_speculative_tokens} drafts by {m.fast.id} "
              f"on {config.lanes.exact.engine}'s engine)\n"
              f"           {m.fast.id} (lane: fast, tp={layout['tp']} x pp={layout['pp']}: {layout['why']})\n"
              f"           auto (router: fast if the prompt's difficulty "
              f"{'>' if config.router.auto_fast_when == 'hard' else '<='} {config.router.auto_threshold}, "
              f"else {config.router.auto_full_tier})\n"
              f"  Ctrl-C to stop", flush=True)
        try:
            if compiling:
                _report_exact_compile(config.name)
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            print("fastmode up: stopping", flush=True)
            return 0
    except KeyboardInterrupt:
        print("fastmode up: interrupted while starting; stopping", flush=True)
        return 130
    finally:
        try:
            if address:
                serve.delete(config.name)
            else:
                serve.shutdown()
        finally:
            ray.shutdown()
        print("fastmode up: stopped", flush=True)


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


DEPLOYING = ("every lane loads its model and serves its warm-up requests, the fast lane compiling its step "
             "first (torch.compile, cached for later starts): a first start on a 2-core CPU takes about 3-5 "
             "minutes")
"""What ``fastmode up`` says while the application deploys."""

COMPILING = "the exact lane serves on eager models until its compile, in the background, has finished"
"""What the ready line adds while the exact lane compiles (``lanes.exact.compile_in_background``)."""


def _exact_compiling(config: AppConfig) -> bool:
    """Whether the exact lane (one replica of it) is still compiling in the background."""
    from ray import serve

    exact = config.lanes.exact
    if not (exact.engine == "fastmode" and exact.compile and exact.compile_in_background):
        return False
    try:
        status = serve.get_deployment_handle("exact-lane", config.name).stats.remote().result(timeout_s=30)["compile"]
    except Exception:  # noqa: BLE001 - a replica being replaced: it compiles again
        return True
    return status is None or status["state"] == "compiling"


def _report_exact_compile(app: str, poll_s: float = 2.0) -> None:
    """Wait until the exact lane (one replica of it) has switched to its compiled models, or its
    compile failed, and say so."""
    from ray import serve

    handle = serve.get_deployment_handle("exact-lane", app)
    while True:
        try:
            status = handle.stats.remote().result(timeout_s=30)["compile"] or {}
        except Exception:  # noqa: BLE001 - a replica being replaced; ask again
            status = {}
        if status.get("state") == "compiled":
            print(f"fastmode up: the exact lane runs compiled (its compile and warm-up took {status['seconds']:.0f} s)",
                  flush=True)
            return
        if status.get("state") == "failed":
            print(f"fastmode up: the exact lane's compile failed, it stays on eager models: {status['error']}",
                  file=sys.stderr, flush=True)
            return
        time.sleep(poll_s)


ERROR_LINE = re.compile(r"^(?:\(\w+ pid=\d+\) )?(?:ERROR \S+ \S+ \[\S+\] +)?"
                        r"((?:[A-Za-z_][\w.]*)?(?:Error|Exception)\b.*)$")
"""A traceback's exception line, without the log prefix vLLM's engine process puts on it."""


def deploy_failures(app: str) -> str:
    """A line per failed deployment of ``app``: its name and the last exception its replicas raised
    (from Serve's status, whose message carries the replica's traceback)."""
    from ray import serve

    try:
        status = serve.status().applications.get(app)
    except Exception:  # noqa: BLE001 - a report of a failure must not fail itself
        return ""
    out = ""
    for name, dep in (status.deployments if status else {}).items():
        if dep.status in ("DEPLOY_FAILED", "UNHEALTHY") and dep.message:
            lines = [line.strip() for line in dep.message.splitlines() if line.strip()]
            # vLLM's engine runs in a process of its own and its error reaches the replica only as "see
            # root cause above": the cause is in the replica process's log, where that process prints it.
            pids = re.findall(r"\bpid=(\d+)", dep.message)
            errors = _errors(lines) + [e for pid in pids[:1] for e in _errors(_log_lines(pid)) if e not in _VAGUE]
            out += f"  {name}: {errors[-1] if errors else lines[-1]}\n"
    return out


_VAGUE = ("Engine core initialization failed",)


def _errors(lines: list[str]) -> list[str]:
    return [e for line in lines if (m := ERROR_LINE.match(line.strip())) and ":" in (e := m.group(1))
            and not e.startswith(_VAGUE)]


def _log_lines(pid: str) -> list[str]:
    """The last lines Ray logged for worker process ``pid`` (its stdout and stderr files)."""
    out: list[str] = []
    for path in sorted(glob.glob(os.path.join(_ray_logs(), f"worker-*-{pid}.*"))):
        with contextlib.suppress(OSError), open(path, errors="replace") as f:
            out += f.readlines()[-400:]
    return out


def _ray_logs() -> str:
    import ray

    try:
        return os.path.join(ray._private.worker._global_node.get_session_dir_path(), "logs")
    except Exception:  # noqa: BLE001
        return "/tmp/ray/session_latest/logs"
