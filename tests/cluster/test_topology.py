"""The topology file: the examples load, and each kind of mistake is a TopologyError naming its field."""

from __future__ import annotations

import copy
from pathlib import Path
import pytest
import yaml

from cluster.topology import REPO_ROOT, Topology, TopologyError, load_topology
from serve.errors import ConfigError

EXAMPLES = sorted((REPO_ROOT / "cluster" / "examples").glob("*.yaml"))


def example(name: str) -> dict:
    return yaml.safe_load((REPO_ROOT / "cluster" / "examples" / f"{name}.yaml").read_text())


def gpu() -> dict:
    """The AWS 2-node GPU example as a dict: 2 nodes x 4 GPUs, 2 chips each."""
    return example("aws-2node-gpu")


def error(data: dict) -> str:
    with pytest.raises(TopologyError) as e:
        load_topology(data)
    return str(e.value)


def test_examples_cover_every_provider():
    assert [p.name for p in EXAMPLES] == ["aws-2node-gpu.yaml", "gcp-2node-gpu.yaml", "local-2node.yaml"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_load_as_two_nodes(path):
    t = load_topology(path)
    assert isinstance(t, Topology)
    assert sum(t.node_count(n) for n in t.node_types) == 2
    # The default pair: the built-in full model by name (each node's install makes it ready), the
    # student at the same place in the nodes' checkout.
    assert t.app_config.models.full.path == "builtin:smollm2-135m-instruct"
    assert t.app_config.models.fast.path == f"{t.install_dir()}/models/fast"


def test_gpu_examples_serve_the_fast_lane_on_gpus():
    for name in ("aws-2node-gpu", "gcp-2node-gpu"):
        t = load_topology(REPO_ROOT / "cluster" / "examples" / f"{name}.yaml")
        assert t.app_config.lanes.fast.device == "cuda"
        assert t.node_types[t.lanes.fast.node_type].gpus > 0


def test_relative_app_path_is_relative_to_the_topology_file(tmp_path):
    # A copy of serve/fastmode.yaml outside this checkout: its ../models/... are the operator's own
    # paths, kept absolute (they must exist on every node).
    (tmp_path / "serve").mkdir()
    (tmp_path / "serve" / "fastmode.yaml").write_text((REPO_ROOT / "serve" / "fastmode.yaml").read_text())
    (tmp_path / "topo").mkdir()
    topology = example("local-2node") | {"app": "../serve/fastmode.yaml"}
    (tmp_path / "topo" / "t.yaml").write_text(yaml.safe_dump(topology))
    t = load_topology(tmp_path / "topo" / "t.yaml")
    assert t.app_config.models.fast.path == str((tmp_path / "models" / "fast").resolve())


def test_app_file_of_this_checkout():
    data = example("local-2node") | {"app": str(REPO_ROOT / "serve" / "fastmode.yaml"),
                                     "install": {"dir": "/srv/fastmode"}}
    t = load_topology(data)
    assert t.app_config.models.fast.path == "/srv/fastmode/models/fast"
    assert t.install_dir() == "/srv/fastmode"


def test_local_node_counts():
    data = example("local-2node")
    data["provider"]["worker_ips"] = ["10.0.0.2", "10.0.0.3"]
    data["node_types"]["big"] = {"chips": 8}
    data["lanes"]["fast"]["node_type"] = "big"
    t = load_topology(data)
    assert (t.node_count("cpu"), t.node_count("big"), t.local_worker_type()) == (1, 2, "big")


def test_topology_error_is_a_config_error():
    assert issubclass(TopologyError, ConfigError) and TopologyError.code == "invalid_topology"


def mutate(base: dict, path: str, value) -> dict:
    data = copy.deepcopy(base)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[key]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return data


DELETE = object()

# (what is wrong, base, field path, new value, text the message must contain)
BAD = [
    ("unknown field", "aws-2node-gpu", "node_types.gpu.gpu_count", 4,
     "node_types.gpu.gpu_count: Extra inputs"),
    ("missing field", "aws-2node-gpu", "provider.region", DELETE, "provider.aws.region: Field required"),
    ("unknown provider", "aws-2node-gpu", "provider.type", "azure", "provider: Input tag 'azure'"),
    ("bad cluster name", "aws-2node-gpu", "name", "my cluster", "name: String should match"),
    ("lane on no node type", "aws-2node-gpu", "lanes.priority.node_type", "tpu",
     "lanes.priority.node_type: no node type 'tpu'"),
    ("lane not placed", "aws-2node-gpu", "lanes.standard", DELETE, "lanes.standard: Field required"),
    ("unknown head type", "aws-2node-gpu", "head_node_type", "cpu", "head_node_type: no node type 'cpu'"),
    ("not enough chips", "aws-2node-gpu", "lanes.fast.replicas", 3,
     "lanes.fast.replicas: 3 replicas x tp=1 x pp=2 need 6 chips; node type 'gpu' has 2 x 2 node(s) = 4"),
    ("stage wider than a node", "aws-2node-gpu", "app.lanes.fast.tp", 4,
     "app.lanes.fast.tp: a stage's 4 tensor-parallel chips must share a node, and a 'gpu' node has 2"),
    ("not enough GPUs", "aws-2node-gpu", "lanes.standard.replicas", 6,
     "lanes: the lanes on node type 'gpu' need 10 GPUs; it has 4 x 2 node(s) = 8"),
    ("replica wider than a node", "aws-2node-gpu", "lanes.standard.gpus", 8,
     "lanes.standard.gpus: 8 per replica, but a 'gpu' node has 4"),
    ("cpu chips on a GPU node", "aws-2node-gpu", "app.lanes.fast.device", "cpu",
     "app.lanes.fast.device: node type 'gpu' has GPUs"),
    ("more chips than GPUs", "aws-2node-gpu", "node_types.gpu.chips", 6,
     "node_types.gpu.chips: on a GPU node type a chip is a GPU; 6 chips > 4 gpus"),
    ("bad app field", "aws-2node-gpu", "app.lanes.fast.pp", 0, "app.lanes.fast.pp: Value error, must be a positive integer or 'auto' (got 0)"),
    ("unknown app field", "aws-2node-gpu", "app.lanes.turbo", {}, "app.lanes.turbo: Extra inputs"),
    ("missing app file", "aws-2node-gpu", "app", "/nonexistent/fastmode.yaml", "cannot read the app config"),
    ("no instance type", "aws-2node-gpu", "node_types.gpu.instance_type", DELETE,
     "node_types.gpu.instance_type: required on aws"),
    ("no image", "aws-2node-gpu", "node_types.gpu.image", DELETE, "node_types.gpu.image: required on aws"),
    ("no cpus on a cloud", "aws-2node-gpu", "node_types.gpu.cpus", DELETE,
     "node_types.gpu.cpus: required on aws"),
    ("accelerator on aws", "aws-2node-gpu", "node_types.gpu.accelerator", "nvidia-l4",
     "node_types.gpu.accelerator: only for gcp"),
    ("no GCP accelerator", "gcp-2node-gpu", "node_types.gpu.accelerator", DELETE,
     "node_types.gpu.accelerator: required on gcp"),
    ("max below min", "aws-2node-gpu", "node_types.gpu.max_workers", 0,
     "node_types.gpu.max_workers: 0 is below min_workers=1"),
    ("bad node type name", "aws-2node-gpu", "node_types.g pu", {"instance_type": "x", "image": "y",
                                                                 "cpus": 1},
     "node_types.g pu: a node type name"),
    ("instance type on local", "local-2node", "node_types.cpu.instance_type", "m5.large",
     "node_types.cpu.instance_type: not used by the local provider"),
    ("max workers on local", "local-2node", "node_types.cpu.max_workers", 3,
     "node_types.cpu.max_workers: not used by the local provider"),
    ("memory on local", "local-2node", "node_types.cpu.memory_gb", 64,
     "node_types.cpu.memory_gb: not used by the local provider"),
    ("two local worker types", "local-2node", "node_types.a", {}, None),
    ("cuda without GPUs", "local-2node", "app", {"lanes": {"fast": {"device": "cuda"}}},
     "app.lanes.fast.device: cuda, but node type 'cpu' has no gpus"),
    ("git without url", "local-2node", "install", {"source": "git"}, "install.git_url: required"),
    ("relative install dir", "local-2node", "install", {"dir": "fastmode"}, "install.dir: must be absolute"),
    ("no replicas", "local-2node", "lanes.priority.replicas", 0,
     "lanes.priority.replicas: Input should be"),
]


@pytest.mark.parametrize("what,base,path,value,expect", BAD, ids=[b[0] for b in BAD])
def test_bad_topology_names_the_field(what, base, path, value, expect):
    data = mutate(example(base), path, value)
    if what == "two local worker types":
        data["node_types"]["b"] = {}
        expect = "node_types: the local provider has one worker type (all of worker_ips); got a, b"
    message = error(data)
    assert expect in message, message


def test_open_ports_need_api_keys(tmp_path):
    data = example("local-2node") | {"app": {"http": {"host": "0.0.0.0"}}}
    assert "app.http.host: binds beyond loopback, so API keys are required" in error(data)
    data = example("local-2node") | {"app": {"grpc": {"host": "10.0.0.1"}}}
    assert "app.grpc.host: binds beyond loopback" in error(data)
    data["app"]["grpc"]["enabled"] = False  # a disabled port binds nothing
    load_topology(data)
    data = example("local-2node") | {"app": {"http": {"host": "0.0.0.0"}}, "api_keys_file": "keys.txt"}
    assert f"api_keys_file: no file at {Path.cwd() / 'keys.txt'}" in error(data)
    (tmp_path / "keys.txt").write_text("k\n")
    data["api_keys_file"] = str(tmp_path / "keys.txt")
    t = load_topology(data)
    assert t.app_config.auth.api_keys_file == "/home/ubuntu/.fastmode/api_keys"
    data["app"]["auth"] = {"api_keys_file": "/etc/fastmode/keys"}
    assert "api_keys_file: the app names its own (app.auth.api_keys_file); keep one" in error(data)
    del data["api_keys_file"]
    assert load_topology(data).app_config.auth.api_keys_file == "/etc/fastmode/keys"


def test_open_ports_without_keys_only_when_the_app_says_so():
    data = example("local-2node") | {"app": {"http": {"host": "0.0.0.0"}, "grpc": {"host": "0.0.0.0"},
                                             "auth": {"allow_public_without_keys": True}}}
    assert load_topology(data).app_config.auth.allow_public_without_keys is True
    data["app"]["http"]["host"] = "127.0.0.2"  # all of 127.0.0.0/8 is loopback
    data["app"]["auth"]["allow_public_without_keys"] = False
    assert "app.grpc.host: binds beyond loopback" in error(data)


def test_local_worker_type_needs_hosts():
    data = example("local-2node")
    data["provider"]["worker_ips"] = []
    data["node_types"]["gpu"] = {"gpus": 1}
    assert "provider.worker_ips: node type 'gpu' has no hosts" in error(data)


def test_lane_on_a_type_without_nodes():
    data = gpu()
    data["node_types"]["spare"] = dict(data["node_types"]["gpu"], min_workers=0, max_workers=0)
    data["lanes"]["priority"]["node_type"] = "spare"
    assert "lanes.priority.node_type: node type 'spare' has no nodes" in error(data)


def test_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "t.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(TopologyError, match="not valid YAML"):
        load_topology(bad)
    bad.write_text("- a list")
    with pytest.raises(TopologyError, match=r"t\.yaml: the top level must be a mapping"):
        load_topology(bad)
    with pytest.raises(TopologyError, match="cannot read the topology"):
        load_topology(tmp_path / "missing.yaml")
    good = tmp_path / "g.yaml"
    good.write_text(yaml.safe_dump(mutate(gpu(), "lanes.fast.replicas", 9)))
    with pytest.raises(TopologyError, match=r"g\.yaml: lanes\.fast\.replicas"):
        load_topology(good)
