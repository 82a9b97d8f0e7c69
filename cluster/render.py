"""Render a topology into the two files that run it: the Ray cluster launcher config (``ray up``)
and the Serve config (``serve deploy``). Both come from the one ``Topology``, so the resources a
node offers and the resources a lane asks for are written by the same code.

Security defaults, visible in what is rendered:

- Ray token authentication stays on: every ``ray start`` runs with ``RAY_AUTH_MODE=token``, and
  the token file (``~/.ray/auth_token`` on this machine, made by ``ray get-auth-token --generate``)
  is copied to every node by ``file_mounts``. The YAML holds its path, never its value.
- The dashboard binds to loopback (``--dashboard-host=127.0.0.1``); reach it with ``ray dashboard``.
  The HTTP and gRPC ports bind to whatever the app config says (loopback by default).
- API keys are never rendered: the topology's ``api_keys_file`` is copied to every node by
  ``file_mounts`` (its path is in the YAML, its keys are not) and the app's
  ``auth.api_keys_file`` names the copy; the gateway reads it there.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import yaml

from serve.config import AppConfig
from sharding.placement import CHIP
from serve.up import serve_config

from .topology import (LANES, NODE_RESOURCE_PER_NODE, REPO_ROOT, LocalProvider, NodeType, Topology, lane_gpus,
                       node_resource)

CLUSTER_FILE = "ray-cluster.yaml"
SERVE_FILE = "serve-config.yaml"
TOKEN_PATH = "~/.ray/auth_token"
"""Ray's default token file, here and on every node (``ray get-auth-token --generate`` writes it)."""
REMOTE_SERVE_CONFIG = "~/fastmode-serve.yaml"
"""Where ``fastmode cluster up`` puts the Serve config on the head node before ``serve deploy``."""
RAY_PORT = 6379
DASHBOARD = "http://127.0.0.1:8265"
"""The head's dashboard as Serve's CLI on the head reaches it (loopback only)."""
CPU_WHEELS = "https://download.pytorch.org/whl/cpu"
"""Where pip finds the CPU torch that the ``cpu`` extra pins (README: "Outside this environment")."""
RSYNC_EXCLUDE = [".venv", ".git", ".fastmode", "**/__pycache__", ".pytest_cache", "*.egg-info"]


def app_config(t: Topology) -> AppConfig:
    """The app config with the topology's placement: per lane, its replicas and the
    ``ray_actor_options`` that pin it to its node type and give it its GPUs (a vLLM lane's
    ``gpus``; a fast lane's chips and GPUs belong to its executor's chip actors, not its replica)."""
    app = t.app_config
    lanes = {}
    for lane in LANES:
        place = t.lanes.of(lane)
        cfg = getattr(app.lanes, lane)
        opts = dict(cfg.ray_actor_options)
        opts["resources"] = dict(opts.get("resources") or {}) | {node_resource(place.node_type): 1}
        opts.pop("num_gpus", None)
        if lane != "fast":
            gpus = lane_gpus(t, lane)
        else:  # the chips (and GPUs) belong to the executor's chip actors, not to the replica
            gpus = 0
        if gpus:
            opts["num_gpus"] = gpus
        lanes[lane] = cfg.model_copy(update={"replicas": place.replicas, "ray_actor_options": opts})
    # On a cluster, Ray Serve's proxy on the head listens (what KubeRay's Service selects), unless the
    # topology's app config chose the gateway's own server (which listens on the node it lands on).
    http = app.http if "server" in app.http.model_fields_set else app.http.model_copy(update={"server": "serve"})
    return app.model_copy(update={"lanes": app.lanes.model_copy(update=lanes), "http": http})


def serve_deploy_config(t: Topology) -> dict:
    """The ``serve deploy`` config of the topology's application."""
    return serve_config(app_config(t))


def node_resources(t: Topology, name: str) -> dict[str, int]:
    """The custom resources a node of type ``name`` offers: its pin, and ``chip`` if the fast lane
    runs there (see ``cluster.topology``)."""
    res = {node_resource(name): NODE_RESOURCE_PER_NODE}
    if t.lanes.fast.node_type == name:
        res[CHIP] = t.node_types[name].chip_count()
    return res


def _autoscaler_resources(t: Topology, name: str) -> dict[str, int]:
    """All resources of a cloud node type, as the autoscaler plans with them."""
    nt = t.node_types[name]
    res: dict[str, int] = {"CPU": nt.cpus}
    if nt.gpus:
        res["GPU"] = nt.gpus
    if nt.memory_gb:
        res["memory"] = int(nt.memory_gb * 2**30)
    return res | node_resources(t, name)


def _start_flags(t: Topology, name: str) -> str:
    nt = t.node_types[name]
    flags = f"--resources={shlex.quote(json.dumps(node_resources(t, name)))}"
    if isinstance(t.provider, LocalProvider):  # a cloud node type's CPU/GPU/memory arrive via the launcher
        if nt.cpus:
            flags += f" --num-cpus={nt.cpus}"
        if nt.gpus:
            flags += f" --num-gpus={nt.gpus}"
    return flags


def _common_setup(t: Topology) -> list[str]:
    d = t.install_dir()
    cmds = []
    if t.install.source == "git":
        cmds += [f"test -d {d}/.git || git clone {shlex.quote(t.install.git_url)} {d}",
                 f"cd {d} && git fetch --depth 1 origin {shlex.quote(t.install.git_ref)} && "
                 f"git checkout --force FETCH_HEAD"]
    # `ray exec` and the start commands run in a login shell: put the venv's ray, serve and fastmode
    # first on PATH, and keep token auth on for every Ray client there (serve deploy, ray status).
    for line in (f"export PATH={d}/.venv/bin:$PATH", "export RAY_AUTH_MODE=token"):
        cmds.append(f"grep -qxF {shlex.quote(line)} ~/.bashrc || echo {shlex.quote(line)} >> ~/.bashrc")
    return cmds


def _install(t: Topology, nt: NodeType) -> str:
    """``make install`` as the README does it: the gpu extra on GPU nodes, else cpu (CPU torch index)."""
    d, py = t.install_dir(), shlex.quote(t.install.python)
    if nt.gpus:
        return f"cd {d} && make install EXTRAS=gpu PYTHON={py}"
    return f"cd {d} && PIP_EXTRA_INDEX_URL={CPU_WHEELS} make install EXTRAS=cpu PYTHON={py}"


def cluster_config(t: Topology) -> dict[str, Any]:
    """The Ray cluster launcher config (validates against ``ray/autoscaler/ray-schema.json``)."""
    p = t.provider
    head = t.head_node_type
    common = _common_setup(t)
    cfg: dict[str, Any] = {"cluster_name": t.name}
    file_mounts = {TOKEN_PATH: TOKEN_PATH}
    if t.install.source == "copy":
        file_mounts[t.install_dir()] = str(REPO_ROOT)
    if t.api_keys_file:  # the path, never the keys
        file_mounts[t.remote_api_keys_file()] = t.api_keys_file
    if isinstance(p, LocalProvider):
        worker = t.local_worker_type()
        cfg |= {
            "provider": {"type": "local", "head_ip": p.head_ip, "worker_ips": list(p.worker_ips)},
            "auth": {"ssh_user": p.ssh_user, "ssh_private_key": p.ssh_private_key},
            "max_workers": len(p.worker_ips),
        }
        worker_setup = [_install(t, t.node_types[worker])]
        worker_flags = " " + _start_flags(t, worker)
    else:
        provider: dict[str, Any] = {"type": p.type, "region": p.region}
        if p.availability_zone:
            provider["availability_zone"] = p.availability_zone
        if p.type == "gcp":
            provider["project_id"] = p.project_id
        else:
            provider["cache_stopped_nodes"] = False  # `ray down` terminates, it does not stop
        types = {}
        for name, nt in t.node_types.items():
            max_workers = nt.min_workers if nt.max_workers is None else nt.max_workers
            types[name] = {"node_config": _node_config(t, nt), "resources": _autoscaler_resources(t, name),
                           "min_workers": nt.min_workers, "max_workers": max_workers,
                           "worker_setup_commands": common + [_install(t, nt)]}
        cfg |= {
            "provider": provider,
            "auth": {"ssh_user": p.ssh_user},
            "max_workers": sum(v["max_workers"] for v in types.values()),
            "upscaling_speed": 1.0,
            "idle_timeout_minutes": t.idle_timeout_minutes,
            "available_node_types": types,
            "head_node_type": head,
        }
        worker_setup = []  # per node type, above
        worker_flags = ""  # the launcher passes each node type's `resources` to `ray start`
    cfg |= {
        "file_mounts": file_mounts,
        "rsync_exclude": RSYNC_EXCLUDE,
        "initialization_commands": [],
        "setup_commands": common,
        "head_setup_commands": [_install(t, t.node_types[head])],
        "worker_setup_commands": worker_setup,
        "head_start_ray_commands": [
            "ray stop",
            f"ulimit -n 65536; RAY_AUTH_MODE=token ray start --head --port={RAY_PORT} "
            f"--dashboard-host=127.0.0.1 --autoscaling-config=~/ray_bootstrap_config.yaml "
            f"{_start_flags(t, head)}",
        ],
        "worker_start_ray_commands": [
            "ray stop",
            f"ulimit -n 65536; RAY_AUTH_MODE=token ray start --address=$RAY_HEAD_IP:{RAY_PORT}{worker_flags}",
        ],
    }
    return cfg


def _node_config(t: Topology, nt: NodeType) -> dict[str, Any]:
    if t.provider.type == "aws":
        return {"InstanceType": nt.instance_type, "ImageId": nt.image,
                "BlockDeviceMappings": [{"DeviceName": "/dev/sda1",
                                         "Ebs": {"VolumeSize": nt.disk_gb, "VolumeType": "gp3"}}]}
    node = {"machineType": nt.instance_type,
            "disks": [{"boot": True, "autoDelete": True, "type": "PERSISTENT",
                       "initializeParams": {"diskSizeGb": nt.disk_gb, "sourceImage": nt.image}}]}
    if nt.gpus:
        node |= {"guestAccelerators": [{"acceleratorType": nt.accelerator, "acceleratorCount": nt.gpus}],
                 "scheduling": [{"onHostMaintenance": "TERMINATE"}],  # GPU VMs cannot live-migrate
                 "metadata": {"items": [{"key": "install-nvidia-driver", "value": "True"}]}}
    return node


def render(t: Topology, out: str | Path) -> tuple[Path, Path]:
    """Write ``ray-cluster.yaml`` and ``serve-config.yaml`` into ``out``; return their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cluster, serve = out / CLUSTER_FILE, out / SERVE_FILE
    header = f"# Rendered by `fastmode cluster render` from topology {t.name!r}: edit that, not this.\n"
    cluster.write_text(header + yaml.safe_dump(cluster_config(t), sort_keys=False))
    serve.write_text(header + yaml.safe_dump(serve_deploy_config(t), sort_keys=False))
    return cluster, serve
