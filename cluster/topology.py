"""The topology file: one YAML that says what a fastmode cluster is made of and what runs where.

From it ``cluster.render`` writes both the Ray cluster launcher config (for ``ray up``) and the
Serve config (for ``serve deploy``), so the two can never disagree. A topology names:

- ``name``: the Ray cluster's name;
- ``provider``: ``local`` (machines you already have: ``head_ip``, ``worker_ips``, ssh user and
  key), ``aws`` (``region``, optional ``availability_zone``) or ``gcp`` (``project_id``,
  ``region``, ``availability_zone``);
- ``node_types``: name -> kind of machine (instance/machine type and image on a cloud, ``cpus``,
  ``gpus``, GCP ``accelerator``, ``chips``, optional ``memory_gb``, ``min_workers``/``max_workers``),
  and ``head_node_type``;
- ``lanes``: for each of ``fast``, ``priority`` and ``standard``, the node type its replicas run on
  and how many replicas (plus GPUs per replica for the vLLM lanes);
- ``app``: the fastmode application config (a path to a ``fastmode up`` YAML, relative to the
  topology file, or the same mapping inline; null for the defaults);
- ``install``: how fastmode gets onto the nodes (a copy of this checkout, or a git clone);
- ``api_keys_file``: optional, a local file of API keys that is copied to every node.

Placement, i.e. how "lane X runs on node type T" becomes Ray scheduling:

- Every node of type ``T`` offers the custom resource ``fastmode_node_T: 1000``
  (``node_resource(T)``) and every replica of a lane placed on ``T`` asks for 1 of it in its
  Serve ``ray_actor_options``, so Ray (and the autoscaler, which launches a ``T`` node when
  replicas wait for one) can only put it there; up to 1000 replicas fit one node.
- The fast lane's chips are the Ray resource ``chip`` (``sharding.placement.CHIP``): its executor
  reserves ``tp x pp`` chip bundles in placement groups, which name no node. So ``chip`` is
  declared *only* on the node type the fast lane runs on; that pins its stages there. On a GPU
  node type a chip is a GPU (``chips`` defaults to ``gpus``; a ``device: cuda`` chip also takes one
  Ray ``GPU``), on a CPU node type a CPU core (``chips`` defaults to ``cpus``).
- The vLLM lanes (priority, standard, exact) take ``gpus`` Ray GPUs per replica (default 1 on a GPU node
  type, 0 on a CPU one). A node type's GPUs are shared by the fast lane's chips and these replicas;
  ``load_topology`` checks that they fit, as it checks the fast lane's chips.

The topology's replicas and placement override the app config's ``replicas`` and
``ray_actor_options`` of each lane (other actor options are kept). Model paths in the app config
name paths on the nodes: a path inside this fastmode checkout (the shipped ``models/``, the
default) maps to the same place in the nodes' checkout (``install.dir``); other absolute paths must
exist on every node.

API keys never appear in a topology or in anything rendered from it: ``api_keys_file`` names a
local file that the launcher copies to every node (like Ray's token), and the gateway reads it
there (``auth.api_keys_file``). An app that binds HTTP or gRPC beyond loopback without a key file
is refused here, before any machine starts (the gateway would refuse to start anyway), unless its
``auth.allow_public_without_keys`` says to serve without keys. TLS files the app config names
(``http.tls_certfile``, ...) are paths on the nodes, like a model path outside this checkout.

``load_topology`` validates all of it and raises ``TopologyError`` naming the offending field.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from models.builtin import PREFIX as BUILTIN_PREFIX
from serve.auth import is_loopback
from serve.config import LANE_CONFIGS, AppConfig
from serve.errors import ConfigError, describe_validation, validate_mapping
from sharding.planner import AUTO

REPO_ROOT = Path(__file__).resolve().parents[1]
LANES = tuple(LANE_CONFIGS)
"""The application's lanes: fast, priority, standard, exact."""
"""This fastmode checkout; what ``install.source: copy`` puts on the nodes."""

NODE_RESOURCE_PER_NODE = 1000
"""``fastmode_node_<type>`` offered by each node; a lane replica takes 1."""

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


class TopologyError(ConfigError):
    """A topology file that does not validate; the message names the field."""

    code = "invalid_topology"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LocalProvider(_Strict):
    """Machines you already have, reached over ssh (Ray's on-prem ``local`` provider)."""

    type: Literal["local"] = Field(description="On-prem: a fixed list of hosts.")
    head_ip: str = Field(min_length=1, description="Host name or IP of the head node.")
    worker_ips: list[str] = Field(default_factory=list, description="Host names or IPs of the worker nodes "
                                  "(all of one node type: the topology's one non-head type, or the head's).")
    ssh_user: str = Field(min_length=1, description="User that ssh logs in as on every host.")
    ssh_private_key: str = Field(min_length=1, description="Path (on this machine) of the ssh private key.")


class AWSProvider(_Strict):
    """Amazon EC2; Ray creates the instances (credentials from the usual AWS environment)."""

    type: Literal["aws"] = Field(description="Amazon Web Services.")
    region: str = Field(min_length=1, description="EC2 region, e.g. us-west-2.")
    availability_zone: str | None = Field(default=None, description="Zone(s), e.g. us-west-2a; default: "
                                          "any zone of the region.")
    ssh_user: str = Field(default="ubuntu", min_length=1, description="Login user of the node image.")


class GCPProvider(_Strict):
    """Google Compute Engine; Ray creates the VMs (credentials from the usual gcloud environment)."""

    type: Literal["gcp"] = Field(description="Google Cloud Platform.")
    project_id: str = Field(min_length=1, description="GCP project the VMs are billed to.")
    region: str = Field(min_length=1, description="Region, e.g. us-central1.")
    availability_zone: str = Field(min_length=1, description="Zone, e.g. us-central1-a (where the GPUs are).")
    ssh_user: str = Field(default="ubuntu", min_length=1, description="Login user of the node image.")


class NodeType(_Strict):
    """One kind of machine. Nodes of a type are alike; lanes are placed on types, not hosts."""

    instance_type: str | None = Field(default=None, description="AWS InstanceType or GCP machineType "
                                      "(required on a cloud, unused on local).")
    image: str | None = Field(default=None, description="AWS ImageId or GCP sourceImage (required on a "
                              "cloud): an image with Python >= 3.11, make and, for GPUs, the NVIDIA driver, "
                              "e.g. an Ubuntu 24.04 Deep Learning AMI or Deep Learning VM image.")
    disk_gb: int = Field(default=200, ge=10, description="Boot disk GB on a cloud (checkpoints, venv, logs).")
    cpus: int | None = Field(default=None, ge=1, description="CPUs per node (required on a cloud, where the "
                             "autoscaler must know; detected on local).")
    gpus: int = Field(default=0, ge=0, description="GPUs per node.")
    accelerator: str | None = Field(default=None, description="GCP acceleratorType of the GPUs, e.g. "
                                    "nvidia-l4 (required on gcp when gpus > 0).")
    chips: int | None = Field(default=None, ge=1, description="The Ray resource `chip` per node, declared "
                              "only if the fast lane runs on this type. Default: gpus on a GPU node type "
                              "(at most gpus), else cpus.")
    memory_gb: float | None = Field(default=None, gt=0, description="Ray `memory` per node in GiB (cloud); "
                                    "default: detected by Ray.")
    min_workers: int = Field(default=0, ge=0, description="Worker nodes of this type kept up (cloud; local "
                             "uses provider.worker_ips).")
    max_workers: int | None = Field(default=None, ge=0, description="Most worker nodes of this type the "
                                    "autoscaler launches (cloud); default: min_workers.")

    def chip_count(self) -> int | None:
        """Chips per node (``None`` when neither ``chips`` nor ``cpus`` says)."""
        return self.chips or self.gpus or self.cpus


class FastLanePlacement(_Strict):
    """Where the fast lane runs: its replicas and their ``tp x pp`` chips, all on one node type."""

    node_type: str = Field(min_length=1, description="Node type of the replicas and their chips.")
    replicas: int = Field(default=1, ge=1, description="Serve replicas (each holds tp x pp chips).")


class VLLMLanePlacement(_Strict):
    """Where a vLLM lane (priority, standard or exact) runs."""

    node_type: str = Field(min_length=1, description="Node type of the replicas.")
    replicas: int = Field(default=1, ge=1, description="Serve replicas (each its own vLLM engine).")
    gpus: float | None = Field(default=None, ge=0, description="Ray GPUs per replica; default: 1 on a GPU "
                               "node type, 0 on a CPU one.")


class LanePlacements(_Strict):
    """Where every lane of the application runs (the app always deploys all four)."""

    fast: FastLanePlacement = Field(description="The small model on fastmode's sharded executor.")
    priority: VLLMLanePlacement = Field(description="The full model on vLLM, low batch cap.")
    standard: VLLMLanePlacement = Field(description="The full model on vLLM, high batch cap.")
    exact: VLLMLanePlacement | None = Field(default=None, description="The full model on vLLM with the "
                                            "fast model drafting; default: priority's placement.")

    def of(self, lane: str) -> FastLanePlacement | VLLMLanePlacement:
        """The placement of ``lane`` (exact's default: priority's)."""
        place = getattr(self, lane)
        return self.priority if place is None else place


class InstallConfig(_Strict):
    """How fastmode gets onto every node: as the README installs it (``make install``)."""

    source: Literal["copy", "git"] = Field(default="copy", description="copy: rsync this checkout to the "
                                           "nodes (Ray file_mounts); git: clone git_url on each node.")
    git_url: str | None = Field(default=None, description="Repository to clone (source: git).")
    git_ref: str = Field(default="main", description="Branch, tag or commit to check out (source: git).")
    dir: str | None = Field(default=None, description="Absolute path of the checkout on every node; "
                            "default: /home/<ssh_user>/fastmode.")
    python: str = Field(default="python3", description="Interpreter (>= 3.11) that makes the nodes' venv.")


class Topology(_Strict):
    """A fastmode cluster: machines, what runs where, and the application."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$", description="Ray cluster name.")
    provider: LocalProvider | AWSProvider | GCPProvider = Field(discriminator="type", description=
                                                                "Where the nodes come from.")
    node_types: dict[str, NodeType] = Field(min_length=1, description="Node type name -> machine kind.")
    head_node_type: str = Field(min_length=1, description="The node type of the head node.")
    lanes: LanePlacements = Field(description="Which node type each lane runs on, and its replicas.")
    app: str | dict[str, Any] | None = Field(default=None, description="The fastmode app config: a path to "
                                             "a `fastmode up` YAML (relative to this file), the same mapping "
                                             "inline, or null for the defaults.")
    install: InstallConfig = Field(default=InstallConfig(), description="How fastmode gets onto the nodes.")
    api_keys_file: str | None = Field(default=None, description="A file on this machine with one API key per "
                                      "line (relative to this file): copied to every node and named in the "
                                      "app's auth.api_keys_file. Required when the app binds HTTP or gRPC "
                                      "beyond loopback, unless the app names a key file already on the nodes.")
    idle_timeout_minutes: float = Field(default=5, ge=0, description="Cloud: remove a worker idle this long "
                                        "(above min_workers).")

    _app: AppConfig | None = PrivateAttr(default=None)

    @property
    def app_config(self) -> AppConfig:
        """The app config as written (model paths already on-node), before the topology's placement."""
        if self._app is None:
            raise RuntimeError("use load_topology(), which resolves the app config")
        return self._app

    def install_dir(self) -> str:
        return self.install.dir or f"/home/{self.provider.ssh_user}/fastmode"

    def remote_api_keys_file(self) -> str:
        """Where ``api_keys_file`` lands on every node."""
        return f"/home/{self.provider.ssh_user}/.fastmode/api_keys"

    def node_count(self, node_type: str) -> int:
        """Most nodes of a type the cluster can have (head included)."""
        head = int(node_type == self.head_node_type)
        if isinstance(self.provider, LocalProvider):
            return head + (len(self.provider.worker_ips) if node_type == self.local_worker_type() else 0)
        nt = self.node_types[node_type]
        return head + (nt.min_workers if nt.max_workers is None else nt.max_workers)

    def local_worker_type(self) -> str:
        """On a local provider: the node type of ``worker_ips`` (the non-head type, else the head's)."""
        others = [n for n in self.node_types if n != self.head_node_type]
        return others[0] if others else self.head_node_type


def node_resource(node_type: str) -> str:
    """The custom Ray resource that pins lanes to ``node_type``."""
    return f"fastmode_node_{node_type}"


def load_topology(source: str | Path | dict) -> Topology:
    """Validate a topology given as a YAML path or a dict; resolve and check its app config.

    Raises ``TopologyError`` naming the field and what is wrong with it.
    """
    origin, base = "topology", Path.cwd()
    if isinstance(source, dict):
        data: Any = source
    else:
        path = Path(source)
        origin, base = str(path), path.resolve().parent
        data = _read_yaml(path, "topology")
    topology = validate_mapping(Topology, data, origin, TopologyError)
    try:
        if topology.api_keys_file:
            keys = Path(topology.api_keys_file).expanduser()
            keys = keys if keys.is_absolute() else base / keys
            if not keys.is_file():
                raise TopologyError(f"api_keys_file: no file at {keys}")
            topology = topology.model_copy(update={"api_keys_file": str(keys.resolve())})
        topology._app = _resolve_app(topology, base)
        _check(topology)
    except TopologyError as e:
        raise TopologyError(f"{origin}: {e}") from None
    return topology


def _read_yaml(path: Path, what: str) -> Any:
    try:
        return yaml.safe_load(path.read_text()) or {}
    except OSError as e:
        raise TopologyError(f"{path}: cannot read the {what}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise TopologyError(f"{path}: not valid YAML: {e}") from None


def _resolve_app(topology: Topology, base: Path) -> AppConfig:
    """The app config with model paths as the nodes see them (see the module docstring)."""
    where, data, app_base = "app", topology.app or {}, base
    if isinstance(topology.app, str):
        path = Path(topology.app) if Path(topology.app).is_absolute() else base / topology.app
        where, data, app_base = f"app ({path})", _read_yaml(path, "app config"), path.resolve().parent
        if not isinstance(data, dict):
            raise TopologyError(f"{where}: the top level must be a mapping, got {type(data).__name__}")
    try:
        app = AppConfig.model_validate(data)
    except ValidationError as e:
        errors = [err | {"loc": ("app", *err["loc"])} for err in e.errors()]
        raise TopologyError(describe_validation(errors, "app")) from None
    models = {}
    for key in ("full", "fast"):
        spec = getattr(app.models, key)
        if spec.path.startswith(BUILTIN_PREFIX):  # made ready on every node by its make install
            models[key] = spec
            continue
        local = Path(spec.path) if Path(spec.path).is_absolute() else (app_base / spec.path)
        local = local.resolve()
        if local.is_relative_to(REPO_ROOT):
            remote = f"{topology.install_dir()}/{local.relative_to(REPO_ROOT).as_posix()}"
        else:
            remote = str(local)  # the operator's own checkpoint: must exist at this path on every node
        models[key] = spec.model_copy(update={"path": remote})
    app = app.model_copy(update={"models": app.models.model_copy(update=models)})
    if topology.api_keys_file:
        if app.auth.api_keys_file:
            raise TopologyError("api_keys_file: the app names its own (app.auth.api_keys_file); keep one")
        app = app.model_copy(update={"auth": app.auth.model_copy(
            update={"api_keys_file": topology.remote_api_keys_file()})})
    open_ports = [f"app.{name}.host" for name, host in (("http", app.http.host), ("grpc", app.grpc.host))
                  if not is_loopback(host) and (name == "http" or app.grpc.enabled)]
    if open_ports and not app.auth.api_keys_file and not app.auth.allow_public_without_keys:
        raise TopologyError(f"{open_ports[0]}: binds beyond loopback, so API keys are required: set "
                            f"api_keys_file (a file here, copied to every node) or app.auth.api_keys_file "
                            f"(a file already on every node)")
    return app


def _check(t: Topology) -> None:
    """Cross-field checks: names, provider needs, and that every lane fits its node type."""
    for name, nt in t.node_types.items():
        at = f"node_types.{name}"
        if not _NAME.match(name):
            raise TopologyError(f"{at}: a node type name is a letter then letters, digits, '_' or '-'")
        if nt.max_workers is not None and nt.max_workers < nt.min_workers:
            raise TopologyError(f"{at}.max_workers: {nt.max_workers} is below min_workers={nt.min_workers}")
        if nt.chips is not None and nt.gpus and nt.chips > nt.gpus:
            raise TopologyError(f"{at}.chips: on a GPU node type a chip is a GPU; {nt.chips} chips > "
                                f"{nt.gpus} gpus")
        _check_provider(t, name, nt, at)
    if t.head_node_type not in t.node_types:
        raise TopologyError(f"head_node_type: no node type {t.head_node_type!r} "
                            f"(have: {', '.join(t.node_types)})")
    if isinstance(t.provider, LocalProvider):
        workers = [n for n in t.node_types if n != t.head_node_type]
        if len(workers) > 1:
            raise TopologyError(f"node_types: the local provider has one worker type (all of worker_ips); "
                                f"got {', '.join(workers)}")
        if workers and not t.provider.worker_ips:
            raise TopologyError(f"provider.worker_ips: node type {workers[0]!r} has no hosts")
    if t.install.source == "git" and not t.install.git_url:
        raise TopologyError("install.git_url: required with install.source: git")
    if t.install.dir is not None and not t.install.dir.startswith("/"):
        raise TopologyError(f"install.dir: must be absolute (model paths are resolved there), "
                            f"got {t.install.dir!r}")
    _check_lanes(t)


def _check_provider(t: Topology, name: str, nt: NodeType, at: str) -> None:
    kind = t.provider.type
    if kind == "local":
        for field in ("instance_type", "image", "accelerator", "max_workers", "memory_gb"):
            if getattr(nt, field) is not None:
                raise TopologyError(f"{at}.{field}: not used by the local provider (hosts are "
                                    f"provider.head_ip and provider.worker_ips; Ray detects their memory)")
        if nt.min_workers:
            raise TopologyError(f"{at}.min_workers: not used by the local provider (see provider.worker_ips)")
        return
    if not nt.instance_type:
        raise TopologyError(f"{at}.instance_type: required on {kind}")
    if nt.cpus is None:
        raise TopologyError(f"{at}.cpus: required on {kind} (the autoscaler plans with it)")
    if not nt.image:
        what = "an ImageId of the region" if kind == "aws" else "a sourceImage"
        raise TopologyError(f"{at}.image: required on {kind} ({what})")
    if kind == "gcp" and nt.gpus and not nt.accelerator:
        raise TopologyError(f"{at}.accelerator: required on gcp when gpus > 0 (e.g. nvidia-l4)")
    if kind == "aws" and nt.accelerator:
        raise TopologyError(f"{at}.accelerator: only for gcp (on aws the instance type brings its GPUs)")


def _check_lanes(t: Topology) -> None:
    app = t.app_config
    gpu_demand = {name: 0.0 for name in t.node_types}
    for lane in LANES:
        place = t.lanes.of(lane)
        if place.node_type not in t.node_types:
            raise TopologyError(f"lanes.{lane}.node_type: no node type {place.node_type!r} "
                                f"(have: {', '.join(t.node_types)})")
        nt = t.node_types[place.node_type]
        nodes = t.node_count(place.node_type)
        if nodes == 0:
            raise TopologyError(f"lanes.{lane}.node_type: node type {place.node_type!r} has no nodes "
                                f"(max_workers is 0 and it is not the head)")
        if lane == "fast":
            cfg = app.lanes.fast
            if nt.gpus and cfg.device != "cuda":
                raise TopologyError(f"app.lanes.fast.device: node type {place.node_type!r} has GPUs, so its "
                                    f"chips are GPUs; set device: cuda")
            if not nt.gpus and cfg.device == "cuda":
                raise TopologyError(f"app.lanes.fast.device: cuda, but node type {place.node_type!r} "
                                    f"has no gpus")
            chips = nt.chip_count()
            if chips is None:
                raise TopologyError(f"node_types.{place.node_type}.chips: the fast lane runs there; "
                                    f"set chips (or cpus, or gpus)")
            # tp/pp 'auto': the lane takes the planner's pick on the chips it finds; it needs one at least.
            tp, pp = (1 if cfg.tp == AUTO else cfg.tp), (1 if cfg.pp == AUTO else cfg.pp)
            if tp > chips:
                raise TopologyError(f"app.lanes.fast.tp: a stage's {tp} tensor-parallel chips must "
                                    f"share a node, and a {place.node_type!r} node has {chips}")
            need = tp * pp * place.replicas
            if need > chips * nodes:
                raise TopologyError(f"lanes.fast.replicas: {place.replicas} replicas x tp={tp} x "
                                    f"pp={pp} need {need} chips; node type {place.node_type!r} has "
                                    f"{chips} x {nodes} node(s) = {chips * nodes}")
            if cfg.device == "cuda":
                gpu_demand[place.node_type] += need
        else:
            gpus = lane_gpus(t, lane)
            if gpus > nt.gpus:
                raise TopologyError(f"lanes.{lane}.gpus: {gpus:g} per replica, but a {place.node_type!r} "
                                    f"node has {nt.gpus}")
            gpu_demand[place.node_type] += gpus * place.replicas
    for name, demand in gpu_demand.items():
        have = t.node_types[name].gpus * t.node_count(name)
        if demand > have:
            raise TopologyError(f"lanes: the lanes on node type {name!r} need {demand:g} GPUs; it has "
                                f"{t.node_types[name].gpus} x {t.node_count(name)} node(s) = {have}")


def lane_gpus(t: Topology, lane: str) -> float:
    """Ray GPUs per replica of a vLLM lane."""
    place = t.lanes.of(lane)
    if place.gpus is not None:
        return place.gpus
    return 1.0 if t.node_types[place.node_type].gpus else 0.0
