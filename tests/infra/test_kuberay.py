"""cluster/kuberay.py and infra/kuberay: the RayService, rendered from the config, checked offline.

The committed manifest is what ``python -m cluster.kuberay`` renders now (its first line names the
arguments); ``serveConfigV2`` is ``serve.up.serve_config`` of the same config (parsed by Ray
Serve's ``ServeDeploySchema``, its application's args by ``AppConfig``); Ray token auth is on; API
keys come only from a Secret. The RayService is checked structurally against the fields of
KubeRay's ``ray.io/v1`` types (no CRD schema ships in a package here), and each pod template, as
a Pod, by ``kubernetes-validate`` where installed; ``kubectl kustomize`` renders the directory
where kubectl is on PATH.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from cluster import kuberay
from cluster.kuberay import WorkerGroup, rayservice
from serve.config import AppConfig, load_config
from serve.up import serve_config
from tests.infra.tools import tool

REPO = Path(__file__).resolve().parents[2]
KUBERAY = REPO / "infra" / "kuberay"
EXAMPLE = KUBERAY / "rayservice.yaml"
SECRET = KUBERAY / "secret.example.yaml"
DOCKERFILE = REPO / "infra" / "container" / "Dockerfile"

# Fields of KubeRay's ray.io/v1 Go types (ray-operator/apis/ray/v1, KubeRay 1.5: RayServiceSpec,
# RayClusterSpec, HeadGroupSpec, WorkerGroupSpec, AuthOptions).
RAYSERVICE_SPEC = {"serveConfigV2", "rayClusterConfig", "serveService", "upgradeStrategy",
                   "excludeHeadPodFromServeSvc", "rayClusterDeletionDelaySeconds",
                   "serviceUnhealthySecondThreshold", "deploymentUnhealthySecondThreshold"}
RAYCLUSTER_SPEC = {"suspend", "managedBy", "autoscalerOptions", "headServiceAnnotations",
                   "enableInTreeAutoscaling", "gcsFaultToleranceOptions", "headGroupSpec", "rayVersion",
                   "workerGroupSpecs", "authOptions"}
HEAD_GROUP = {"template", "headService", "enableIngress", "rayStartParams", "serviceType"}
WORKER_GROUP = {"suspend", "groupName", "replicas", "minReplicas", "maxReplicas", "idleTimeoutSeconds",
                "rayStartParams", "template", "scaleStrategy", "numOfHosts"}
AUTH_OPTIONS = {"mode", "secretName", "enableK8sTokenAuth"}


def example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def render_command() -> list[str]:
    first = EXAMPLE.read_text().splitlines()[0]
    m = re.fullmatch(r"# Rendered by `(.+)`; do not edit by hand\.", first)
    assert m, first
    argv = shlex.split(m.group(1))
    assert argv[:3] == ["python", "-m", "cluster.kuberay"]
    return argv[3:]


def containers(manifest: dict) -> list[dict]:
    cluster = manifest["spec"]["rayClusterConfig"]
    templates = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    return [c for t in templates for c in t["spec"]["containers"]]


# --- the committed example --------------------------------------------------------------------


def test_example_is_a_fresh_render(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert kuberay.main(render_command()) == 0
    assert capsys.readouterr().out == EXAMPLE.read_text(), (
        "infra/kuberay/rayservice.yaml is stale: re-render it with the command on its first line")


def test_serve_config_v2_is_serve_deploy_schema_and_the_app_config():
    from ray.serve.schema import ServeDeploySchema

    manifest = example()
    text = manifest["spec"]["serveConfigV2"]
    assert isinstance(text, str)
    data = yaml.safe_load(text)
    schema = ServeDeploySchema.model_validate(data)
    [app] = schema.applications
    assert app.import_path == "serve.app:build_app" and app.route_prefix == "/"
    config = AppConfig.model_validate(data["applications"][0]["args"]["config"])
    assert config.http.host == "0.0.0.0" and config.grpc.host == "0.0.0.0"
    assert schema.http_options.host == "0.0.0.0" and schema.http_options.port == config.http.port
    # KubeRay's serve Service sends traffic to Serve's proxies: they listen, not the gateway.
    assert config.http.server == "serve" and data["proxy_location"] == "HeadOnly"
    # A pod shares its node: `cpus: auto` (the default) is not applied there.
    assert load_config(None).cpus == "auto" and config.cpus == "off"
    assert kuberay.serve_config(load_config({"cpus": "6-7"}))["applications"][0]["args"]["config"]["cpus"] == "6-7"
    # One source of truth: fastmode up's serve_config, with only the pod's hosts, who listens on HTTP,
    # the CPU placement and the model paths changed.
    local = load_config(None, resolve_models=False)
    expected = serve_config(load_config(local.model_dump(mode="json") | {
        "http": local.http.model_dump() | {"host": "0.0.0.0", "server": "serve"},
        "grpc": local.grpc.model_dump() | {"host": "0.0.0.0"}, "cpus": "off"}, resolve_models=False))
    models = expected["applications"][0]["args"]["config"]["models"]
    models["fast"]["path"] = f"{kuberay.APP_DIR}/models/{Path(models['fast']['path']).name}"  # the built-in stays
    assert data == expected


def test_model_paths_are_the_shipped_models_in_the_image():
    data = yaml.safe_load(example()["spec"]["serveConfigV2"])
    models = data["applications"][0]["args"]["config"]["models"]
    workdir = re.search(r"^WORKDIR\s+(\S+)", DOCKERFILE.read_text(), re.MULTILINE).group(1)
    assert workdir == kuberay.APP_DIR
    assert re.search(r"^COPY\s+models/\s+models/", DOCKERFILE.read_text(), re.MULTILINE)
    # the built-in full model by name (the image's install makes it ready), the student in the image
    assert models["full"]["path"] == "builtin:smollm2-135m-instruct"
    assert re.search(r"^ENV FASTMODE_CACHE=", DOCKERFILE.read_text(), re.MULTILINE)
    rel = Path(models["fast"]["path"]).relative_to(kuberay.APP_DIR)
    assert (REPO / rel / "distilled.json").exists(), models["fast"]


def test_user_model_paths_are_kept():
    # Models that exist only on the pods' volumes: an AppConfig is taken as is, its paths kept.
    cfg = AppConfig.model_validate({"models": {"fast": {"id": "f", "path": "/mnt/models/fast"}}})
    data = yaml.safe_load(rayservice(cfg)["spec"]["serveConfigV2"])
    models = data["applications"][0]["args"]["config"]["models"]
    assert models["fast"]["path"] == "/mnt/models/fast"
    assert models["full"]["path"] == "builtin:smollm2-135m-instruct"


def test_no_api_key_anywhere():
    from tests.serve.conftest import API_KEY

    def strings(node):
        if isinstance(node, dict):
            for k, v in node.items():
                yield k
                yield from strings(v)
        elif isinstance(node, list):
            for v in node:
                yield from strings(v)
        elif isinstance(node, str):
            yield node
            if "\n" in node:  # serveConfigV2
                yield from strings(yaml.safe_load(node))

    for path in sorted(KUBERAY.glob("*.yaml")):
        assert API_KEY not in path.read_text()
        for doc in yaml.safe_load_all(path.read_text()):
            for value in strings(doc):
                assert not re.search(r"\bsk-\w", value), f"{path.name}: an API key? {value!r}"
    manifest = example()
    for c in containers(manifest):
        [env] = [e for e in c["env"] if e["name"] == "FASTMODE_API_KEYS"]
        assert "value" not in env
        ref = env["valueFrom"]["secretKeyRef"]
        assert ref == {"name": kuberay.DEFAULT_SECRET, "key": kuberay.SECRET_KEY}
    config = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"][0]["args"]["config"]
    assert config["auth"] == {"api_keys_env": "FASTMODE_API_KEYS", "api_keys_file": None,
                              "allow_public_without_keys": False}  # the pods bind 0.0.0.0: keys required
    # The Secret example names the same Secret and key, and holds no key.
    secret = yaml.safe_load(SECRET.read_text())
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == kuberay.DEFAULT_SECRET
    assert secret["stringData"] == {kuberay.SECRET_KEY: ""}


def test_api_keys_env_follows_the_config():
    manifest = rayservice({"auth": {"api_keys_env": "MY_KEYS"}})
    for c in containers(manifest):
        assert [e["name"] for e in c["env"] if "valueFrom" in e] == ["MY_KEYS"]


def test_ray_token_auth_stays_on():
    cluster = example()["spec"]["rayClusterConfig"]
    assert cluster["authOptions"] == {"mode": "token"}
    major, minor, _ = (int(x) for x in cluster["rayVersion"].split("."))
    assert (major, minor) >= (2, 52), "Ray token auth needs Ray 2.52+"
    import ray

    assert cluster["rayVersion"].split(".")[:2] == ray.__version__.split(".")[:2]
    for c in containers(example()):
        assert all(e["name"] not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN") for e in c["env"])


@pytest.mark.parametrize("argv", [[], ["--gpu", "--workers", "2", "--chips", "4"], ["--workers", "0"],
                                  ["--config", str(REPO / "infra" / "container" / "fastmode.yaml")],
                                  ["--otel-endpoint", "http://collector:4317", "--name", "other"]])
def test_every_render_keeps_ray_token_auth_on(argv, capsys):
    # Whatever the command line: KubeRay generates the token Secret and sets it on every Ray container
    # (authOptions), and nothing in the manifest turns it off or carries a token.
    assert kuberay.main(argv) == 0
    out = capsys.readouterr().out
    manifest = yaml.safe_load(out)
    assert manifest["spec"]["rayClusterConfig"]["authOptions"] == {"mode": "token"}
    assert "RAY_AUTH_MODE" not in out and "RAY_AUTH_TOKEN" not in out and "disabled" not in out


def test_chip_resources_and_gpus_per_worker_group():
    manifest = rayservice(None, worker_groups=[WorkerGroup("cpu", replicas=2, chips=3),
                                               WorkerGroup("gpu", replicas=2, chips=4, gpu=True)])
    cpu, gpu = manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    for group, chips in ((cpu, 3), (gpu, 4)):
        raw = group["rayStartParams"]["resources"]
        assert raw.startswith('"{') and json.loads(json.loads(raw)) == {"chip": chips}
        assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 2
    [gpu_container] = gpu["template"]["spec"]["containers"]
    assert gpu_container["resources"]["limits"]["nvidia.com/gpu"] == 4
    [cpu_container] = cpu["template"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in cpu_container["resources"]["limits"]
    # The committed example: 'resources' written as KubeRay's docs do, a quoted JSON string.
    assert "resources: '\"{\\\"chip\\\": 2}\"'" in EXAMPLE.read_text()


def test_ports_and_metrics_follow_the_config():
    config = load_config(None)
    manifest = example()
    cluster = manifest["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]
    ports = {p["name"]: p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"]}
    assert ports["serve"] == config.http.port == 8000
    assert ports["grpc"] == config.grpc.port == 9000
    assert ports["metrics"] == config.http.metrics_port == 8080
    assert ports["dashboard"] == 8265 and ports["gcs-server"] == 6379
    for spec in [head] + cluster["workerGroupSpecs"]:
        assert spec["rayStartParams"]["metrics-export-port"] == str(config.http.metrics_port)
    # infra/prometheus scrapes the same port.
    prom = yaml.safe_load((REPO / "infra" / "prometheus" / "prometheus.yml").read_text())
    [job] = [j for j in prom["scrape_configs"] if j["job_name"] == "fastmode"]
    assert job["static_configs"][0]["targets"][0].endswith(f":{config.http.metrics_port}")
    # ...and the image exposes them.
    exposed = {int(p) for line in re.findall(r"^EXPOSE\s+(.+)$", DOCKERFILE.read_text(), re.MULTILINE)
               for p in line.split()}
    assert {ports["serve"], ports["grpc"], ports["metrics"]} <= exposed


def test_pods_run_as_the_images_non_root_user():
    uid = re.search(r"^USER\s+(\d+)", DOCKERFILE.read_text(), re.MULTILINE).group(1)
    cluster = example()["spec"]["rayClusterConfig"]
    for template in [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]:
        pod = template["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert str(pod["securityContext"]["runAsUser"]) == uid
        for c in pod["containers"]:
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["resources"]["requests"] and c["resources"]["limits"]
            assert c["image"] == kuberay.DEFAULT_IMAGE
        # /dev/shm is a memory volume (Ray's object store).
        [shm] = [v for v in pod["volumes"] if v["name"] == "dshm"]
        assert shm["emptyDir"]["medium"] == "Memory"


def test_rayservice_fields_are_kuberays():
    manifest = example()
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayService"
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", manifest["metadata"]["name"])
    spec = manifest["spec"]
    assert set(spec) <= RAYSERVICE_SPEC
    cluster = spec["rayClusterConfig"]
    assert set(cluster) <= RAYCLUSTER_SPEC and set(cluster["authOptions"]) <= AUTH_OPTIONS
    assert cluster["authOptions"]["mode"] in ("disabled", "token")
    head = cluster["headGroupSpec"]
    assert set(head) <= HEAD_GROUP and "template" in head
    names = [g["groupName"] for g in cluster["workerGroupSpecs"]]
    assert len(names) == len(set(names))
    for group in cluster["workerGroupSpecs"]:
        assert set(group) <= WORKER_GROUP and {"groupName", "template"} <= set(group)
        assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    for params in [head["rayStartParams"]] + [g["rayStartParams"] for g in cluster["workerGroupSpecs"]]:
        assert all(isinstance(v, str) for v in params.values()), "rayStartParams is map[string]string"
    # KubeRay finds the head and worker containers by position; the first is Ray's.
    assert head["template"]["spec"]["containers"][0]["name"] == "ray-head"


# --- the command line ---------------------------------------------------------------------------


def test_cli_gpu_workers(capsys):
    assert kuberay.main(["--workers", "2", "--chips", "4", "--gpu", "--image", "reg.example/fastmode:gpu"]) == 0
    out = capsys.readouterr().out
    manifest = yaml.safe_load(out)
    [group] = manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert group["groupName"] == "gpu-workers" and group["replicas"] == 2
    [c] = group["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 4 and c["image"] == "reg.example/fastmode:gpu"


def test_cli_bad_config(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("lanes: {fast: {tp: 0}}\n")
    assert kuberay.main(["--config", str(bad)]) == 2
    assert "lanes.fast.tp" in capsys.readouterr().err


# --- TLS ---------------------------------------------------------------------------------------


def pods(manifest: dict) -> list[dict]:
    cluster = manifest["spec"]["rayClusterConfig"]
    return [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]


def test_a_tls_secret_gives_grpc_tls_from_a_mount_on_every_pod(tmp_path):
    from tests.serve.conftest import self_signed

    manifest = rayservice(None, tls_secret="fastmode-tls")
    for pod in pods(manifest):
        [volume] = [v for v in pod["volumes"] if v["name"] == "tls"]
        assert volume["secret"]["secretName"] == "fastmode-tls"
        [mount] = [m for c in pod["containers"] for m in c["volumeMounts"] if m["name"] == "tls"]
        assert mount == {"name": "tls", "mountPath": kuberay.TLS_DIR, "readOnly": True}
        # the key is readable by the image's user (runAsUser 1000) through fsGroup 1000, and by no one else
        assert volume["secret"]["defaultMode"] == 0o440 and pod["securityContext"]["fsGroup"] == 1000
    [app] = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"]
    config = app["args"]["config"]
    assert config["http"]["tls_certfile"] is None  # KubeRay's operator checks the proxies over plain HTTP
    # The file names are a kubernetes.io/tls Secret's keys: a certificate and key mounted under those
    # names load as the gRPC server's pair (the pod's load_config, with the mount moved here).
    cert, key = self_signed(tmp_path)
    (tmp_path / "tls.crt").write_bytes(cert.read_bytes())
    (tmp_path / "tls.key").write_bytes(key.read_bytes())
    grpc = config["grpc"]
    assert (grpc["tls_certfile"], grpc["tls_keyfile"]) == (f"{kuberay.TLS_DIR}/tls.crt", f"{kuberay.TLS_DIR}/tls.key")
    here = json.loads(json.dumps(config).replace(kuberay.TLS_DIR, str(tmp_path))
                      .replace("/app/models", str(REPO / "models")))
    loaded = load_config(here)
    assert loaded.grpc.tls and not loaded.http.tls
    assert not any(v["name"] == "tls" for pod in pods(rayservice(None)) for v in pod["volumes"])  # none without


def test_the_ingress_serves_https_and_wss_for_the_serve_service(capsys):
    assert kuberay.main(["--tls-secret", "fastmode-tls", "--host", "llm.example.com", "--name", "fm"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["RayService", "Ingress"]
    ing = docs[1]
    assert ing["apiVersion"] == "networking.k8s.io/v1" and ing["spec"]["ingressClassName"] == "nginx"
    assert ing["spec"]["tls"] == [{"hosts": ["llm.example.com"], "secretName": "fastmode-tls"}]
    [rule] = ing["spec"]["rules"]
    [path] = rule["http"]["paths"]
    assert rule["host"] == "llm.example.com" and path["path"] == "/" and path["pathType"] == "Prefix"
    # KubeRay's serve Service for the RayService "fm", on the port its proxies listen on
    assert path["backend"]["service"] == {"name": "fm-serve-svc", "port": {"number": load_config(None).http.port}}
    notes = ing["metadata"]["annotations"]
    g = load_config(None).gateway
    assert notes["nginx.ingress.kubernetes.io/proxy-read-timeout"] == str(int(g.max_connection_age_s))
    assert notes["nginx.ingress.kubernetes.io/proxy-body-size"] == f"{g.max_body_bytes // 2**20}m"
    assert notes["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"  # tokens stream as they come


def test_tls_secret_and_host_go_together(capsys):
    with pytest.raises(SystemExit) as e:
        kuberay.main(["--tls-secret", "fastmode-tls"])
    assert e.value.code == 2 and "--tls-secret and --host go together" in capsys.readouterr().err


# --- tools, where installed -------------------------------------------------------------------


def test_kustomize_renders_namespace_and_rayservice():
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) not on PATH")
    out = subprocess.run([kubectl, "kustomize", str(KUBERAY)], check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert sorted(d["kind"] for d in docs) == ["Namespace", "RayService"]
    [svc] = [d for d in docs if d["kind"] == "RayService"]
    assert svc["metadata"]["namespace"] == "fastmode" == yaml.safe_load(SECRET.read_text())["metadata"]["namespace"]
    assert svc["spec"]["serveConfigV2"] == example()["spec"]["serveConfigV2"]


def test_pod_templates_validate_as_pods(tmp_path):
    validate = tool("kubernetes-validate")
    if validate is None:
        pytest.skip("kubernetes-validate not on PATH (in the test extra)")
    cluster = example()["spec"]["rayClusterConfig"]
    templates = {"head": cluster["headGroupSpec"]["template"]}
    templates |= {g["groupName"]: g["template"] for g in cluster["workerGroupSpecs"]}
    docs = [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": t["spec"]}
            for name, t in templates.items()]
    docs.append(yaml.safe_load(SECRET.read_text()))
    docs.append(yaml.safe_load((KUBERAY / "namespace.yaml").read_text()))
    tls = rayservice(None, tls_secret="fastmode-tls")["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]
    docs.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "head-tls"}, "spec": tls["spec"]})
    docs.append(kuberay.ingress(None, host="llm.example.com", tls_secret="fastmode-tls"))
    path = tmp_path / "pods.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    out = subprocess.run([validate, "--strict", str(path)], check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
