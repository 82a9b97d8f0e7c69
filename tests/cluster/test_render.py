"""Rendering: the launcher YAML passes Ray's own schema, the Serve config passes Serve's and ours, and
both say the same thing about where each lane runs."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config
from ray.serve.schema import ServeDeploySchema

from cluster.render import TOKEN_PATH, app_config, cluster_config, node_resources, render
from cluster.topology import REPO_ROOT, TopologyError, load_topology
from serve.config import AppConfig, load_config

EXAMPLES = sorted((REPO_ROOT / "cluster" / "examples").glob("*.yaml"))
SCHEMA = json.loads(Path(os.path.dirname(ray.__file__), "autoscaler", "ray-schema.json").read_text())
"""The JSON schema Ray's cluster launcher checks its config against."""


def example(name: str) -> dict:
    return yaml.safe_load((REPO_ROOT / "cluster" / "examples" / f"{name}.yaml").read_text())


def rendered(topology, tmp_path) -> tuple[dict, dict, str]:
    cluster, serve = render(topology, tmp_path)
    text = cluster.read_text() + serve.read_text()
    return yaml.safe_load(cluster.read_text()), yaml.safe_load(serve.read_text()), text


def start_commands(cfg: dict) -> list[str]:
    return [c for c in cfg["head_start_ray_commands"] + cfg["worker_start_ray_commands"] if "ray start" in c]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_renders_valid_configs(path, tmp_path):
    cluster, serve, _ = rendered(load_topology(path), tmp_path)
    jsonschema.validate(cluster, SCHEMA)
    validate_config(prepare_config(cluster))  # Ray's own checks after filling its defaults (no cloud calls)
    ServeDeploySchema.model_validate(serve)
    [application] = serve["applications"]
    assert application["import_path"] == "serve.app:build_app"
    app = AppConfig.model_validate(application["args"]["config"])
    # On a cluster Serve's proxy on the head listens (no example chooses the gateway's own server).
    assert app.http.server == "serve" and serve["proxy_location"] == "HeadOnly"


def test_a_topology_may_choose_the_gateways_own_server(tmp_path):
    doc = example("local-2node") | {"app": {"http": {"server": "gateway"}}}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(doc))
    app = app_config(load_topology(tmp_path / "t.yaml"))
    assert app.http.server == "gateway"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_security_defaults(path, tmp_path):
    cluster, serve, text = rendered(load_topology(path), tmp_path)
    head = [c for c in cluster["head_start_ray_commands"] if "ray start" in c]
    assert head and all("--dashboard-host=127.0.0.1" in c for c in head)
    assert "0.0.0.0" not in text
    # Token auth on: every ray start asks for it, the token file (by path) reaches every node.
    assert all(c.count("RAY_AUTH_MODE=token ray start") == 1 for c in start_commands(cluster))
    assert "disabled" not in text
    # ...and so does every Ray client on the nodes (ray exec's login shell: serve deploy, ray status).
    setups = [cluster["setup_commands"]] + [t["worker_setup_commands"]
                                            for t in cluster.get("available_node_types", {}).values()]
    assert all(any("export RAY_AUTH_MODE=token" in c and ".bashrc" in c for c in s) for s in setups)
    assert cluster["file_mounts"][TOKEN_PATH] == TOKEN_PATH
    assert serve["http_options"]["host"] == "127.0.0.1"


def test_no_secret_in_any_rendered_file(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTMODE_API_KEYS", "sk-fastmode-secret-1,sk-fastmode-secret-2")
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("ray-token-secret-value")
    keys = tmp_path / "keys.txt"
    keys.write_text("sk-fastmode-secret-3\n")
    for path in EXAMPLES:
        # Served beyond loopback, with keys from a local file that the launcher copies to every node.
        data = yaml.safe_load(path.read_text())
        data["app"] = (data.get("app") or {}) | {"http": {"host": "0.0.0.0"}}
        data["api_keys_file"] = str(keys)
        t = load_topology(data)
        cluster, serve, text = rendered(t, tmp_path / path.stem)
        for secret in ("sk-fastmode-secret-1", "sk-fastmode-secret-2", "sk-fastmode-secret-3",
                       "ray-token-secret-value"):
            assert secret not in text
        remote = "/home/ubuntu/.fastmode/api_keys"
        assert cluster["file_mounts"][remote] == str(keys)
        assert serve["applications"][0]["args"]["config"]["auth"]["api_keys_file"] == remote
        assert serve["http_options"]["host"] == "0.0.0.0"


def test_chips_and_pins_on_a_gpu_cloud(tmp_path):
    t = load_topology(REPO_ROOT / "cluster" / "examples" / "aws-2node-gpu.yaml")
    cluster, serve, _ = rendered(t, tmp_path)
    gpu = cluster["available_node_types"]["gpu"]
    assert gpu["resources"] == {"CPU": 48, "GPU": 4, "memory": 180 * 2**30,
                                "fastmode_node_gpu": 1000, "chip": 2}
    assert gpu["node_config"]["InstanceType"] == "g5.12xlarge"
    assert (gpu["min_workers"], gpu["max_workers"], cluster["head_node_type"]) == (1, 1, "gpu")
    [head] = [c for c in cluster["head_start_ray_commands"] if "ray start" in c]
    assert json.loads(shlex.split(head.split("--resources=")[1])[0]) == {"fastmode_node_gpu": 1000, "chip": 2}
    lanes = serve["applications"][0]["args"]["config"]["lanes"]
    assert lanes["fast"]["replicas"] == 1 and lanes["fast"]["device"] == "cuda"
    assert lanes["fast"]["ray_actor_options"] == {"num_cpus": 0, "resources": {"fastmode_node_gpu": 1}}
    assert lanes["priority"]["ray_actor_options"] == {"num_cpus": 0, "num_gpus": 1.0,
                                                       "resources": {"fastmode_node_gpu": 1}}
    assert lanes["standard"]["replicas"] == 2


def test_gcp_node_config_has_its_gpus(tmp_path):
    t = load_topology(REPO_ROOT / "cluster" / "examples" / "gcp-2node-gpu.yaml")
    cluster, _, _ = rendered(t, tmp_path)
    node = cluster["available_node_types"]["gpu"]["node_config"]
    assert node["machineType"] == "n1-standard-32"
    assert node["guestAccelerators"] == [{"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 4}]
    assert cluster["provider"] == {"type": "gcp", "region": "us-central1",
                                        "availability_zone": "us-central1-a", "project_id": "my-project"}


def test_local_provider_passes_resources_to_ray_start(tmp_path):
    cluster, _, _ = rendered(load_topology(REPO_ROOT / "cluster" / "examples" / "local-2node.yaml"), tmp_path)
    assert cluster["provider"] == {"type": "local", "head_ip": "192.168.1.10", "worker_ips": ["192.168.1.11"]}
    for cmd in start_commands(cluster):
        assert "--resources='{\"fastmode_node_cpu\": 1000, \"chip\": 4}'" in cmd
        assert "--num-cpus=16" in cmd
    assert "available_node_types" not in cluster  # Ray's local provider makes its own


def test_chip_only_where_the_fast_lane_runs(tmp_path):
    # CPU head for the vLLM-free router and gateway, GPU workers for every lane.
    data = example("aws-2node-gpu")
    data["node_types"]["head"] = {"instance_type": "m5.2xlarge", "image": "ami-0123456789abcdef0", "cpus": 8}
    data["head_node_type"] = "head"
    data["node_types"]["gpu"] |= {"min_workers": 2, "max_workers": 2}
    t = load_topology(data)
    assert node_resources(t, "head") == {"fastmode_node_head": 1000}
    assert node_resources(t, "gpu") == {"fastmode_node_gpu": 1000, "chip": 2}
    cluster, _, _ = rendered(t, tmp_path)
    jsonschema.validate(cluster, SCHEMA)
    assert "chip" not in cluster["available_node_types"]["head"]["resources"]
    assert cluster["max_workers"] == 2
    # The head's install is the CPU one, the GPU workers' the GPU one.
    assert "EXTRAS=cpu" in cluster["head_setup_commands"][0]
    assert "EXTRAS=gpu" in cluster["available_node_types"]["gpu"]["worker_setup_commands"][-1]


def test_fast_lane_chips_belong_to_its_chip_actors_not_its_replica():
    data = example("aws-2node-gpu")
    data["app"]["lanes"]["fast"] |= {"tp": 1, "pp": 1}
    data["lanes"]["fast"]["replicas"] = 4
    opts = app_config(load_topology(data)).lanes.fast.ray_actor_options
    assert opts == {"num_cpus": 0, "resources": {"fastmode_node_gpu": 1}}  # even one chip is a chip actor
    data["lanes"]["fast"]["replicas"] = 5  # 5 chips > 2 x 2
    with pytest.raises(TopologyError, match="lanes.fast.replicas: 5 replicas x tp=1 x pp=1 need 5 chips"):
        load_topology(data)


def test_topology_overrides_placement_but_keeps_other_actor_options():
    data = example("local-2node")
    data["app"] = {"lanes": {"standard": {"replicas": 5, "ray_actor_options": {
        "num_cpus": 1, "num_gpus": 1, "resources": {"ssd": 1}}}}}
    data["lanes"]["standard"]["replicas"] = 2
    lane = app_config(load_topology(data)).lanes.standard
    assert lane.replicas == 2
    # num_gpus comes from the topology (0 on a CPU node type), the rest is the app's.
    assert lane.ray_actor_options == {"num_cpus": 1, "resources": {"ssd": 1, "fastmode_node_cpu": 1}}


def test_rendered_app_loads_where_fastmode_is_installed(tmp_path):
    # With the nodes' checkout at this checkout's path, the rendered app is exactly loadable here.
    data = example("local-2node") | {"install": {"dir": str(REPO_ROOT)}}
    _, serve, _ = rendered(load_topology(data), tmp_path)
    from models.builtin import default_pair

    config = load_config(serve["applications"][0]["args"]["config"])
    assert (config.models.full.path, config.models.fast.path) == tuple(map(str, default_pair()))


def test_install_by_copy_or_by_git():
    t = load_topology(example("local-2node"))
    cfg = cluster_config(t)
    assert cfg["file_mounts"]["/home/ubuntu/fastmode"] == str(REPO_ROOT)
    assert ".venv" in cfg["rsync_exclude"]
    assert "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu make install EXTRAS=cpu" in \
        cfg["head_setup_commands"][0]
    git = {"source": "git", "git_url": "https://example.org/fastmode.git", "git_ref": "v1",
           "python": "python3.11"}
    data = example("local-2node") | {"install": git}
    cfg = cluster_config(load_topology(data))
    assert "/home/ubuntu/fastmode" not in cfg["file_mounts"]
    assert cfg["setup_commands"][0] == ("test -d /home/ubuntu/fastmode/.git || "
                                        "git clone https://example.org/fastmode.git /home/ubuntu/fastmode")
    assert "origin v1" in cfg["setup_commands"][1]
    assert cfg["worker_setup_commands"][0].endswith("make install EXTRAS=cpu PYTHON=python3.11")
