"""infra/otel: the collector config, the compose file and the Kubernetes manifests, checked offline.

Nothing here starts a container: the files are parsed and checked for internal consistency (every
pipeline component defined, ports and names agreeing across files, loopback-only publishing, one
source of truth for the collector config). Where the tools are on PATH, ``kubectl kustomize``
renders the manifests, ``kubernetes-validate`` checks them against Kubernetes' schemas and
``check-jsonschema`` checks the compose file against the compose spec; otherwise those tests skip.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.infra.tools import tool

OTEL = Path(__file__).resolve().parents[2] / "infra" / "otel"
COLLECTOR = OTEL / "collector.yaml"
COMPOSE = OTEL / "docker-compose.yaml"
KUSTOMIZATION = OTEL / "kustomization.yaml"
K8S = OTEL / "k8s"


def load(path: Path):
    return yaml.safe_load(path.read_text())


def k8s_docs() -> list[dict]:
    return [d for p in sorted(K8S.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def of_kind(kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in k8s_docs() if d["kind"] == kind}


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


# --- every file -------------------------------------------------------------------------------


def test_every_yaml_parses():
    files = sorted(OTEL.rglob("*.yaml")) + sorted(OTEL.rglob("*.yml"))
    assert {COLLECTOR, COMPOSE, KUSTOMIZATION} <= set(files)
    assert len(list(K8S.glob("*.yaml"))) >= 3
    for path in files:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert docs, f"{path} is empty"
        assert all(isinstance(d, dict) for d in docs), path


# --- the collector config ---------------------------------------------------------------------


def test_collector_pipelines_use_only_defined_components():
    cfg = load(COLLECTOR)
    service = cfg["service"]
    assert service["pipelines"], "no pipelines"
    for name, pipeline in service["pipelines"].items():
        assert name.split("/")[0] == "traces", f"only traces for now, got {name}"
        assert pipeline["receivers"] and pipeline["exporters"], name
        for section in ("receivers", "processors", "exporters"):
            for component in pipeline.get(section, []):
                defined = cfg.get(section) or {}
                assert component in defined, f"{name}: {section[:-1]} {component} not defined"
    for ext in service.get("extensions", []):
        assert ext in (cfg.get("extensions") or {}), f"extension {ext} not defined"
    # Nothing defined and left unused (the collector would ignore it, silently).
    used = {c for p in service["pipelines"].values() for s in ("receivers", "processors", "exporters")
            for c in p.get(s, [])}
    for section in ("receivers", "processors", "exporters"):
        assert set(cfg.get(section) or {}) <= used, f"unused {section}"
    assert set(cfg.get("extensions") or {}) <= set(service.get("extensions", []))


def test_collector_processors_order_memory_limiter_first():
    pipeline = load(COLLECTOR)["service"]["pipelines"]["traces"]
    assert pipeline["processors"][0] == "memory_limiter"
    assert "batch" in pipeline["processors"]


def test_collector_receives_otlp_on_4317_and_4318():
    protocols = load(COLLECTOR)["receivers"]["otlp"]["protocols"]
    assert port_of(protocols["grpc"]["endpoint"]) == 4317
    assert port_of(protocols["http"]["endpoint"]) == 4318
    # Reachable from outside the container or pod (compose restricts publishing to loopback).
    assert protocols["grpc"]["endpoint"].startswith("0.0.0.0:")
    assert protocols["http"]["endpoint"].startswith("0.0.0.0:")


def test_collector_exports_to_jaeger_file_and_debug():
    cfg = load(COLLECTOR)
    exporters = cfg["exporters"]
    jaeger = [v for k, v in exporters.items() if k.split("/")[0] in ("otlp", "otlp_grpc")]
    assert len(jaeger) == 1
    assert jaeger[0]["endpoint"] == "jaeger:4317"
    assert jaeger[0]["tls"]["insecure"] is True
    file = exporters["file"]
    assert file["path"] == "/data/spans.json"
    assert file.get("format", "json") == "json"  # OTLP JSON lines, what `fastmode trace` reads
    assert file["rotation"]["max_megabytes"] > 0
    assert exporters["debug"]["verbosity"] == "basic"


def test_collector_health_check_on_13133():
    cfg = load(COLLECTOR)
    assert "health_check" in cfg["service"]["extensions"]
    assert port_of(cfg["extensions"]["health_check"]["endpoint"]) == 13133


# --- docker compose ---------------------------------------------------------------------------


def test_compose_mounts_the_collector_config_and_data_dir():
    svc = load(COMPOSE)["services"]["otel-collector"]
    mounts = {}
    for volume in svc["volumes"]:
        src, dst, *_ = volume.split(":")
        mounts[dst] = (COMPOSE.parent / src).resolve()
    config_arg = next(a for a in svc["command"] if a.startswith("--config="))
    config_path = config_arg.split("=", 1)[1]
    assert mounts[config_path] == COLLECTOR.resolve()
    assert mounts["/data"] == (OTEL / "data").resolve()
    assert (OTEL / "data").is_dir()
    # The file exporter writes under the mounted /data.
    assert load(COLLECTOR)["exporters"]["file"]["path"].startswith("/data/")


def test_compose_publishes_only_on_loopback():
    services = load(COMPOSE)["services"]
    published = {}
    for name, svc in services.items():
        for port in svc.get("ports", []):
            assert isinstance(port, str), f"{name}: use the 'HOST_IP:HOST:CONTAINER' string form"
            host_ip, host, container = port.split(":")
            assert host_ip == "127.0.0.1", f"{name} publishes {port} beyond loopback"
            published[int(host)] = (name, int(container))
    assert published == {4317: ("otel-collector", 4317), 4318: ("otel-collector", 4318),
                         16686: ("jaeger", 16686)}


def test_compose_images_are_pinned_and_collector_reaches_jaeger():
    services = load(COMPOSE)["services"]
    for name, svc in services.items():
        image, _, tag = svc["image"].rpartition(":")
        assert image and re.fullmatch(r"\d+\.\d+\.\d+", tag), f"{name}: pin a version, got {svc['image']}"
    assert services["otel-collector"]["image"].startswith("otel/opentelemetry-collector-contrib:")
    assert services["jaeger"]["image"].startswith("jaegertracing/")
    host = load(COLLECTOR)["exporters"]["otlp_grpc/jaeger"]["endpoint"].split(":")[0]
    assert host in services
    assert "jaeger" in services["otel-collector"]["depends_on"]


# --- Kubernetes -------------------------------------------------------------------------------


def test_k8s_documents_have_api_version_kind_and_name():
    docs = k8s_docs()
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["Deployment", "Deployment", "Namespace", "Service", "Service"]
    for doc in docs:
        assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"]
        assert "namespace" not in doc["metadata"], "the kustomization sets the namespace"


def test_kustomization_lists_every_manifest_and_generates_the_collector_config():
    kust = load(KUSTOMIZATION)
    assert kust["namespace"] == "fastmode-observability"
    assert set(of_kind("Namespace")) == {"fastmode-observability"}
    resources = {(OTEL / r).resolve() for r in kust["resources"]}
    assert resources == {p.resolve() for p in K8S.glob("*.yaml")}
    [gen] = kust["configMapGenerator"]
    [entry] = gen["files"]
    key, _, src = entry.rpartition("=")
    assert (OTEL / src).resolve() == COLLECTOR.resolve()  # one source of truth
    assert not list(K8S.glob("*configmap*")), "no hand-copied ConfigMap"
    # The collector Deployment mounts that ConfigMap and reads that key.
    pod = of_kind("Deployment")["otel-collector"]["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == gen["name"]
    [container] = pod["containers"]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    config_arg = next(a for a in container["args"] if a.startswith("--config="))
    assert config_arg.split("=", 1)[1] == f"{mount['mountPath']}/{key}"
    # The file exporter's directory is a writable volume (the root filesystem is read-only).
    assert any(m["mountPath"] == "/data" for m in container["volumeMounts"])


def _container_ports(deployment: dict) -> dict:
    ports = {}
    for c in deployment["spec"]["template"]["spec"]["containers"]:
        for p in c.get("ports", []):
            ports[p["containerPort"]] = p["containerPort"]
            if "name" in p:
                ports[p["name"]] = p["containerPort"]
    return ports


def test_services_select_deployments_and_target_their_ports():
    deployments = of_kind("Deployment")
    for name, svc in of_kind("Service").items():
        selector = svc["spec"]["selector"]
        matches = [d for d in deployments.values()
                   if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()]
        assert len(matches) == 1, f"service {name} selects {len(matches)} deployments"
        ports = _container_ports(matches[0])
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            assert target in ports, f"service {name}: targetPort {target} is no container port"
            assert ports[target] == port["port"], f"service {name}: {port['port']} -> {ports[target]}"
    assert {p["port"] for p in of_kind("Service")["otel-collector"]["spec"]["ports"]} == {4317, 4318}
    assert {16686, 4317} <= {p["port"] for p in of_kind("Service")["jaeger"]["spec"]["ports"]}


def test_collector_reaches_jaeger_through_its_service():
    host, port = load(COLLECTOR)["exporters"]["otlp_grpc/jaeger"]["endpoint"].split(":")
    assert port and int(port) in {p["port"] for p in of_kind("Service")[host]["spec"]["ports"]}


def test_deployments_are_probed_limited_and_non_root():
    collector_cfg = load(COLLECTOR)
    for name, dep in of_kind("Deployment").items():
        spec = dep["spec"]
        assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
        pod = spec["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        ports = _container_ports(dep)
        for c in pod["containers"]:
            image, _, tag = c["image"].rpartition(":")
            assert re.fullmatch(r"\d+\.\d+\.\d+", tag), c["image"]
            assert c["resources"]["requests"] and c["resources"]["limits"]
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            for probe in ("readinessProbe", "livenessProbe"):
                port = c[probe]["httpGet"]["port"]
                assert port in ports, f"{name}: {probe} port {port} is no container port"
                assert ports[port] == 13133
    health = of_kind("Deployment")["otel-collector"]["spec"]["template"]["spec"]["containers"][0]
    assert port_of(collector_cfg["extensions"]["health_check"]["endpoint"]) == _container_ports(
        of_kind("Deployment")["otel-collector"])[health["readinessProbe"]["httpGet"]["port"]]


def test_compose_and_k8s_run_the_same_images():
    compose = {svc["image"] for svc in load(COMPOSE)["services"].values()}
    k8s = {c["image"] for d in of_kind("Deployment").values()
           for c in d["spec"]["template"]["spec"]["containers"]}
    assert compose == k8s


# --- tools, where installed -------------------------------------------------------------------


def _kustomize() -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) not on PATH")
    out = subprocess.run([kubectl, "kustomize", str(OTEL)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_kustomize_renders_with_the_collector_config_from_the_file():
    docs = _kustomize()
    namespaces = {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"}
    assert namespaces == {"fastmode-observability"}
    [cm] = [d for d in docs if d["kind"] == "ConfigMap"]
    assert cm["data"]["config.yaml"] == COLLECTOR.read_text()
    [dep] = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "otel-collector"]
    names = [v["configMap"]["name"] for v in dep["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
    assert names == [cm["metadata"]["name"]]  # the hash-suffixed name followed into the Deployment


def test_kubernetes_schema(tmp_path):
    validate = tool("kubernetes-validate")
    if validate is None:
        pytest.skip("kubernetes-validate not on PATH (in the test extra)")
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump_all(_kustomize()))
    out = subprocess.run([validate, "--strict", str(rendered)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_compose_schema():
    check = tool("check-jsonschema")
    if check is None:
        pytest.skip("check-jsonschema not on PATH (in the test extra)")
    out = subprocess.run([check, "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
