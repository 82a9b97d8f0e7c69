"""A KubeRay ``RayService`` for the application, rendered from the same config as ``fastmode up``.

``serveConfigV2`` is ``serve.up.serve_config(config)`` (what ``fastmode up --print-serve-config``
prints), so the manifest and a local run deploy the same application. Security defaults:

- Ray token authentication on (``authOptions.mode: token``: KubeRay generates the token into a
  Secret and sets it on every Ray container; needs KubeRay 1.5.1+ and Ray 2.52+);
- API keys from a Kubernetes Secret through the environment variable the config names
  (``auth.api_keys_env``, ``FASTMODE_API_KEYS``), never in the manifest; the HTTP and gRPC ports
  bind to all interfaces inside the pod (Services reach them), so the gateway refuses to start
  without keys;
- non-root containers without privilege escalation;
- TLS, with ``--tls-secret NAME`` (a ``kubernetes.io/tls`` Secret) and ``--host``: an ``Ingress`` for
  the serve Service terminates https and wss with the Secret (KubeRay's operator checks each Serve
  proxy over plain HTTP, ``GET /-/healthz`` on the serve port, so the proxies themselves stay plain
  inside the cluster), and the gRPC port speaks TLS itself with the same Secret, mounted read-only
  at ``TLS_DIR`` in every pod.

Every worker pod declares ``chip`` resources (the fast lane's executor puts one stage actor on each
chip) through ``rayStartParams``; on GPU workers one chip is one GPU (``nvidia.com/gpu`` limit).

    python -m cluster.kuberay [--config FILE] [--image IMG] [--workers N --chips N [--gpu]]
                              [--tls-secret NAME --host HOST [--ingress-class nginx]] > rayservice.yaml

``infra/kuberay/rayservice.yaml`` is this module's output for the defaults, kept current by a test.
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

APP_DIR = "/app"
"""Where infra/container/Dockerfile puts the repository (and so the shipped models) in the image."""
DEFAULT_IMAGE = "fastmode:cpu"
DEFAULT_SECRET = "fastmode-api-keys"
SECRET_KEY = "api-keys"
"""The key in the API-key Secret whose value is the comma-separated keys."""
RAY_PORTS = {"gcs-server": 6379, "dashboard": 8265, "client": 10001}
TLS_DIR = "/etc/fastmode/tls"
"""Where ``--tls-secret`` is mounted: ``tls.crt`` and ``tls.key``, a ``kubernetes.io/tls`` Secret's keys."""


@dataclass(frozen=True)
class WorkerGroup:
    """One KubeRay worker group: ``replicas`` pods with ``chips`` chips each."""

    name: str = "workers"
    replicas: int = 1
    chips: int = 2
    gpu: bool = False
    """A chip is one NVIDIA GPU (``nvidia.com/gpu: chips``); otherwise chips are CPU cores' share."""
    cpu: str = "4"
    memory: str = "16Gi"
    min_replicas: int | None = None
    max_replicas: int | None = None
    node_selector: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.replicas < 0 or self.chips < 1:
            raise ValueError(f"worker group {self.name}: replicas >= 0 and chips >= 1 needed")


def serve_config(config, grpc_tls: bool = False) -> dict:
    """``serve.up.serve_config`` of ``config`` as it runs in the pods: HTTP and gRPC on all of the
    pod's interfaces (Services reach them), HTTP through Ray Serve's proxy, the shipped models at their
    path in the image (other model paths are kept: they must exist on every pod, e.g. a mounted
    volume). ``grpc_tls``: the gRPC port serves TLS with the certificate mounted at ``TLS_DIR``. HTTP
    stays plain in the pods whatever ``config`` says (KubeRay's operator checks the proxies over plain
    HTTP; TLS ends at the Ingress). ``cpus: auto`` becomes ``off``: a pod shares its node, and without
    a static CPU manager's cpuset it sees every CPU of the host, so ``auto`` would crowd the serving
    processes onto the host's last CPU (a CPU list in ``config`` is kept)."""
    from models import MODELS_DIR
    from models.builtin import PREFIX as BUILTIN_PREFIX
    from serve.config import AppConfig
    from serve.up import serve_config as up_serve_config

    data = config.model_dump(mode="json")
    data["http"]["host"] = "0.0.0.0"
    data["grpc"]["host"] = "0.0.0.0"
    data["http"]["server"] = "serve"  # KubeRay's serve Service sends traffic to Ray Serve's proxies
    data["http"]["tls_certfile"] = data["http"]["tls_keyfile"] = None
    if data["cpus"] == "auto":
        data["cpus"] = "off"
    if grpc_tls:
        data["grpc"]["tls_certfile"], data["grpc"]["tls_keyfile"] = f"{TLS_DIR}/tls.crt", f"{TLS_DIR}/tls.key"
    out = up_serve_config(AppConfig.model_validate(data))
    for app in out["applications"]:
        for spec in app["args"]["config"]["models"].values():
            if spec["path"].startswith(BUILTIN_PREFIX):
                continue
            path = Path(spec["path"])
            if path.is_relative_to(MODELS_DIR):
                spec["path"] = str(PurePosixPath(APP_DIR, "models", *path.relative_to(MODELS_DIR).parts))
    return out


def serve_config_v2(config, grpc_tls: bool = False) -> str:
    """The ``serveConfigV2`` string: YAML of ``serve_config(config, grpc_tls)``."""
    return yaml.safe_dump(serve_config(config, grpc_tls), sort_keys=False)


def _ray_version() -> str:
    import ray

    major, minor = ray.__version__.split(".")[:2]
    return f"{major}.{minor}.0"


def _resources(cpu: str, memory: str, gpus: int = 0) -> dict:
    limits: dict[str, Any] = {"cpu": cpu, "memory": memory}
    if gpus:
        limits["nvidia.com/gpu"] = gpus
    return {"requests": {"cpu": cpu, "memory": memory}, "limits": limits}


def _env(config, secret: str, otel_endpoint: str | None) -> list[dict]:
    env = [{"name": config.auth.api_keys_env,
            "valueFrom": {"secretKeyRef": {"name": secret, "key": SECRET_KEY}}}]
    if otel_endpoint:
        env += [{"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": otel_endpoint},
                {"name": "OTEL_EXPORTER_OTLP_PROTOCOL", "value": "grpc"}]
    return env


def _pod(container: dict, shm: str, node_selector: dict[str, str] | None = None, tls_secret: str | None = None
         ) -> dict:
    container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    container["securityContext"] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    spec: dict[str, Any] = {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        # Ray's object store lives in /dev/shm; the container default (64 MiB) is far too small.
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}}],
    }
    if tls_secret:  # every pod: the gRPC server's replica may land on any of them
        container["volumeMounts"].append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
        spec["volumes"].append({"name": "tls", "secret": {"secretName": tls_secret, "defaultMode": 0o440}})
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {"spec": spec}


def rayservice(config=None, *, name: str = "fastmode", image: str = DEFAULT_IMAGE,
               head_resources: dict[str, str] | None = None,
               worker_groups: list[WorkerGroup] | tuple[WorkerGroup, ...] = (WorkerGroup(),),
               secret: str = DEFAULT_SECRET, otel_endpoint: str | None = None, tls_secret: str | None = None) -> dict:
    """The ``ray.io/v1`` RayService for ``config``: a YAML path, a dict or ``None`` (the defaults),
    validated by ``load_config`` (model paths must exist here; built-in names are kept, each pod's
    image has them ready), or an ``AppConfig`` taken as is
    (e.g. ``AppConfig.model_validate`` of models that exist only on the pods' volumes).
    ``tls_secret``: a ``kubernetes.io/tls`` Secret mounted at ``TLS_DIR`` in every pod, the gRPC
    port's certificate (``ingress`` terminates https and wss with it)."""
    from serve.config import load_config

    config = load_config(config, resolve_models=False)  # the pods convert and assemble their own
    head = {"cpu": "2", "memory": "8Gi"} | dict(head_resources or {})
    metrics_port = config.http.metrics_port
    env = _env(config, secret, otel_endpoint)
    ports = [{"name": k, "containerPort": v} for k, v in RAY_PORTS.items()]
    ports += [{"name": "serve", "containerPort": config.http.port},
              {"name": "metrics", "containerPort": metrics_port}]
    if config.grpc.enabled:
        ports.append({"name": "grpc", "containerPort": config.grpc.port})
    head_container = {"name": "ray-head", "image": image, "imagePullPolicy": "IfNotPresent",
                      "env": copy.deepcopy(env), "ports": ports,
                      "resources": _resources(head["cpu"], head["memory"])}
    workers = []
    for group in worker_groups:
        container = {"name": "ray-worker", "image": image, "imagePullPolicy": "IfNotPresent",
                     "env": copy.deepcopy(env),
                     "ports": [{"name": "metrics", "containerPort": metrics_port}],
                     "resources": _resources(group.cpu, group.memory, group.chips if group.gpu else 0)}
        workers.append({
            "groupName": group.name,
            "replicas": group.replicas,
            "minReplicas": group.replicas if group.min_replicas is None else group.min_replicas,
            "maxReplicas": group.replicas if group.max_replicas is None else group.max_replicas,
            "rayStartParams": {
                # A JSON object inside a quoted string: KubeRay passes it to `ray start --resources`.
                "resources": json.dumps(json.dumps({"chip": group.chips})),
                "metrics-export-port": str(metrics_port),
            },
            "template": _pod(container, "4Gi", group.node_selector, tls_secret),
        })
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": name,
                                              "app.kubernetes.io/part-of": "fastmode"}},
        "spec": {
            "serveConfigV2": serve_config_v2(config, grpc_tls=tls_secret is not None),
            "rayClusterConfig": {
                "rayVersion": _ray_version(),
                "authOptions": {"mode": "token"},       # Ray token authentication stays on
                "enableInTreeAutoscaling": False,
                "headGroupSpec": {
                    "rayStartParams": {
                        # The operator reaches the dashboard to deploy serveConfigV2 (token-protected).
                        "dashboard-host": "0.0.0.0",
                        "metrics-export-port": str(metrics_port),
                    },
                    "template": _pod(head_container, "2Gi", tls_secret=tls_secret),
                },
                "workerGroupSpecs": workers,
            },
        },
    }


def ingress(config=None, *, name: str = "fastmode", host: str, tls_secret: str,
            ingress_class: str = "nginx") -> dict:
    """A ``networking.k8s.io/v1`` Ingress for the RayService ``name``'s serve Service (KubeRay names it
    ``NAME-serve-svc``): https and wss for ``host`` with the ``kubernetes.io/tls`` Secret
    ``tls_secret``. With ingress-nginx (``ingress_class``), its annotations keep a persistent WebSocket
    up for the gateway's ``max_connection_age_s``, stream tokens unbuffered, and cap a body at
    ``max_body_bytes`` (the gateway's own limit behind it)."""
    from serve.config import load_config

    config = load_config(config, resolve_models=False)
    g = config.gateway
    annotations = {}
    if ingress_class == "nginx":
        seconds = str(int(g.max_connection_age_s))
        annotations = {"nginx.ingress.kubernetes.io/proxy-read-timeout": seconds,
                       "nginx.ingress.kubernetes.io/proxy-send-timeout": seconds,
                       "nginx.ingress.kubernetes.io/proxy-buffering": "off",
                       "nginx.ingress.kubernetes.io/proxy-body-size": f"{-(-g.max_body_bytes // 2**20)}m"}
    backend = {"service": {"name": f"{name}-serve-svc", "port": {"number": config.http.port}}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "fastmode"},
                     **({"annotations": annotations} if annotations else {})},
        "spec": {
            "ingressClassName": ingress_class,
            "tls": [{"hosts": [host], "secretName": tls_secret}],
            "rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": backend}]}}],
        },
    }


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data) -> bool:  # no &id001 anchors: each pod spec reads on its own
        return True


def _str(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(manifest: dict) -> str:
    """YAML for ``manifest``, multi-line strings (``serveConfigV2``) as literal blocks."""
    return yaml.dump(manifest, Dumper=_Dumper, sort_keys=False, width=110)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m cluster.kuberay", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", metavar="FILE", help="deployment YAML (default: the built-in defaults)")
    ap.add_argument("--name", default="fastmode", help="RayService name (default: %(default)s)")
    ap.add_argument("--image", default=DEFAULT_IMAGE, help="image built from infra/container/Dockerfile "
                    "(default: %(default)s)")
    ap.add_argument("--secret", default=DEFAULT_SECRET, help=f"Secret whose key {SECRET_KEY!r} holds the "
                    "comma-separated API keys (default: %(default)s)")
    ap.add_argument("--head-cpu", default="2")
    ap.add_argument("--head-memory", default="8Gi")
    ap.add_argument("--workers", type=int, default=1, help="worker pods (default: %(default)s)")
    ap.add_argument("--chips", type=int, default=2, help="chips per worker pod (default: %(default)s)")
    ap.add_argument("--gpu", action="store_true", help="a chip is one NVIDIA GPU (nvidia.com/gpu limit)")
    ap.add_argument("--worker-cpu", default="4")
    ap.add_argument("--worker-memory", default="16Gi")
    ap.add_argument("--otel-endpoint", help="OTLP/gRPC collector for traces, e.g. "
                    "http://otel-collector.fastmode-observability:4317 (infra/otel)")
    ap.add_argument("--tls-secret", metavar="NAME", help="a kubernetes.io/tls Secret: an Ingress for --host "
                    f"serves https and wss with it, and the gRPC port serves TLS with it (mounted at {TLS_DIR})")
    ap.add_argument("--host", help="the Ingress's host name (with --tls-secret)")
    ap.add_argument("--ingress-class", default="nginx", help="the Ingress's class (default: %(default)s; its "
                    "annotations are ingress-nginx's)")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = _parser()
    args = ap.parse_args(argv)
    if bool(args.tls_secret) != bool(args.host):
        ap.error("--tls-secret and --host go together (the Ingress serves https for that host with that Secret)")
    from serve.config import load_config
    from serve.errors import ConfigError

    group = WorkerGroup(name="gpu-workers" if args.gpu else "workers", replicas=args.workers, chips=args.chips,
                        gpu=args.gpu, cpu=args.worker_cpu, memory=args.worker_memory)
    try:
        config = load_config(args.config, resolve_models=False)
        manifest = rayservice(config, name=args.name, image=args.image,
                              head_resources={"cpu": args.head_cpu, "memory": args.head_memory},
                              worker_groups=[group], secret=args.secret, otel_endpoint=args.otel_endpoint,
                              tls_secret=args.tls_secret)
        extra = [ingress(config, name=args.name, host=args.host, tls_secret=args.tls_secret,
                         ingress_class=args.ingress_class)] if args.tls_secret else []
    except (ConfigError, ValueError) as e:
        print(f"cluster.kuberay: {e}", file=sys.stderr)
        return 2
    command = shlex.join(["python", "-m", "cluster.kuberay", *argv])
    sys.stdout.write(f"# Rendered by `{command}`; do not edit by hand.\n"
                     f"# API keys: the Secret {args.secret!r} (see infra/kuberay/secret.example.yaml).\n"
                     + "---\n".join(dump(doc) for doc in [manifest, *extra]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
