"""The Serve application: ``build_app`` turns a deployment config into the deployment graph

    Gateway (HTTP + WebSocket ingress) -> Lane "fast"     (ShardedLaneEngine, tp x pp chips)
    GrpcServer (grpc.aio, own port)   -> Lane "priority" (VLLMLaneEngine, low max_num_seqs)
                                      -> Lane "standard" (VLLMLaneEngine, high max_num_seqs)
                                      -> Lane "exact"    (SpeculativeLaneEngine, or vLLM's draft_model)
                                      -> StoredResponses "responses" (``store: true`` turns)

Each front door holds a ``serve.router.Router`` (a library: it picks the lane and streams from the
lane's replica directly), so a token's chunk crosses lane replica -> front door -> client; the fast
lane's from the ring's head chip itself (``serve.lanes.head_links``). (The
gateway holds the gRPC server's handle only so that Serve deploys it with the application.)

It is also the ``import_path`` for ``serve deploy`` / ``serve run``:
``serve.app:build_app`` with ``args: {config: <path or inline mapping>}`` (see docs/operating.md).
"""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve import Application

from sharding import cpus

from .config import AppConfig, load_config
from .conversation import StoredResponses
from .gateway import Gateway
from .lanes.lane import EXACT, FAST, LANES, Lane
from .rpc.server import GrpcServer

# Serve's default max_ongoing_requests (5) would queue streams in front of an engine that has room.
UNCAPPED = 10_000


class LaneReplica(Lane):
    """A lane's Serve replica: ``Lane``, counted ready by Serve only once it has served its warm-up
    requests (``Lane.warmup``), so ``serve.run`` (and ``fastmode up``'s URLs, ``/health``) wait for
    every lane to be at full speed, not for its first user."""

    async def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Before the engine starts, so that vLLM's scheduler process (EngineCore) inherits the serving
        # cores; its workers bind to the compute cores (serve.lanes.vllm_engine).
        cpus.place("serving")  # FASTMODE_CPUS, from actor_options
        Lane.__init__(self, *args, **kwargs)
        await self.warmup()


def build_app(args: dict[str, Any] | None = None) -> Application:
    """The application for ``args = {"config": path | mapping | None}`` (``None``: the defaults)."""
    config = load_config((args or {}).get("config"))
    return build(config)


def actor_options(config: AppConfig, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with ``config.serve_env`` and ``config.cpus`` (``FASTMODE_CPUS``, read by
    ``sharding.cpus.place``) in its ``runtime_env``'s ``env_vars`` (those already there win)."""
    options = dict(options)
    runtime_env = dict(options.get("runtime_env") or {})
    runtime_env["env_vars"] = (dict(config.serve_env) | {cpus.ENV: config.cpus}
                               | dict(runtime_env.get("env_vars") or {}))
    if runtime_env["env_vars"]:
        options["runtime_env"] = runtime_env
    return options


def build(config: AppConfig) -> Application:
    """The application for a validated config."""
    handles = {}
    for lane in LANES:
        cfg = getattr(config.lanes, lane)
        model = config.models.fast if lane == FAST else config.models.full
        # A rejecting lane's replica refuses a stream beyond its batch cap itself (serve.router), so
        # Serve must not queue one in front of it.
        handles[lane] = serve.deployment(LaneReplica).options(
            name=f"{lane}-lane", num_replicas=cfg.replicas,
            ray_actor_options=actor_options(config, cfg.ray_actor_options),
            max_ongoing_requests=UNCAPPED, health_check_timeout_s=60, graceful_shutdown_timeout_s=5,
            **({"max_constructor_retry_count": cfg.max_constructor_retry_count}
               if cfg.max_constructor_retry_count is not None else {}),
        ).bind(lane, model.id, model.path, cfg.model_dump(mode="json"), config.telemetry.model_dump(mode="json"),
               draft_path=config.models.fast.path if lane == EXACT else None,
               door=config.model_dump(mode="json") if lane == FAST and config.door_on() else None,
               chat_template=model.chat_template, chat_template_kwargs=model.chat_template_kwargs)
    g = config.gateway
    stored = serve.deployment(StoredResponses).options(
        name="responses", num_replicas=1, ray_actor_options=actor_options(config, {"num_cpus": 0}),
        max_ongoing_requests=UNCAPPED,
    ).bind(g.stored_responses, g.stored_response_bytes)
    grpc_server = None
    if config.grpc.enabled:
        grpc_server = serve.deployment(GrpcServer).options(
            name="grpc", num_replicas=1, ray_actor_options=actor_options(config, {"num_cpus": 0}),
        ).bind(config.model_dump(mode="json"), **handles, stored=stored)
    return serve.deployment(Gateway).options(
        name="gateway", ray_actor_options=actor_options(config, {"num_cpus": 0}), max_ongoing_requests=UNCAPPED,
    ).bind(config.model_dump(mode="json"), **handles, grpc_server=grpc_server, stored=stored)
