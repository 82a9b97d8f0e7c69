"""infra/prometheus and infra/grafana: the scrape config, the dashboard and its provisioning.

Offline: every PromQL query of the dashboard names only series that serve/metrics.py defines (as
Ray exports them: ``ray_`` prefix, ``_bucket``/``_sum``/``_count`` for histograms) and only labels
those series carry; the panels have unique ids and a valid, non-overlapping layout; the scrape
config's targets match the config defaults and Ray's service-discovery file; the compose file
wires the files it mounts together. Where installed, ``promql_parser`` parses every query,
``promtool`` checks the scrape config and ``check-jsonschema`` the compose file (else those skip).

Live (slow): after requests to a running application (its fast lane a tp=1 x pp=2 pipeline), every series
the dashboard queries appears in a real scrape of Ray's metrics endpoint, with the labels it uses.
"""

from __future__ import annotations

import json
import re
import shutil
import ssl
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import yaml
from websockets.sync.client import connect

from serve.config import HTTPConfig
from tests.infra.tools import tool

INFRA = Path(__file__).resolve().parents[2] / "infra"
PROMETHEUS = INFRA / "prometheus" / "prometheus.yml"
GRAFANA = INFRA / "grafana"
DASHBOARD = GRAFANA / "fastmode.json"
COMPOSE = GRAFANA / "docker-compose.yaml"
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "prometheus.yaml"
PROVIDERS = GRAFANA / "provisioning" / "dashboards" / "fastmode.yaml"

# Labels Prometheus itself attaches to every scraped series.
TARGET_LABELS = {"job", "instance"}
# What the dashboard's template variables stand for when a query is parsed.
VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$job": "fastmode", "$lane": "fast"}


def load(path: Path):
    return yaml.safe_load(path.read_text())


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


# --- what serve/metrics.py defines --------------------------------------------------------------


def defined_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """``name -> (kind, tag_keys)`` of every metric ``serve.metrics`` defines, read by running its
    constructor against stand-ins for ``ray.util.metrics`` (nothing is registered with Ray)."""
    import serve.metrics

    made: dict[str, tuple[str, tuple[str, ...]]] = {}

    def kind(name):
        def make(metric, description="", boundaries=None, tag_keys=None, **kw):
            if name == "Counter":  # Counter(name, description, tag_keys=...)
                tag_keys = kw.get("tag_keys", tag_keys)
            else:  # Histogram(name, description, boundaries, tag_keys)
                tag_keys = tag_keys if tag_keys is not None else kw.get("tag_keys")
            made[metric] = (name, tuple(tag_keys or ()))
        return make

    fake = types.ModuleType("ray.util.metrics")
    fake.Counter, fake.Histogram, fake.Gauge = kind("Counter"), kind("Histogram"), kind("Gauge")
    saved = sys.modules.get("ray.util.metrics")
    sys.modules["ray.util.metrics"] = fake
    try:
        serve.metrics._metrics.__wrapped__()
    finally:
        if saved is None:
            del sys.modules["ray.util.metrics"]
        else:
            sys.modules["ray.util.metrics"] = saved
    return made


def exported_series() -> dict[str, set[str]]:
    """Every series name Ray exports for those metrics -> the labels it may carry (beyond Ray's own)."""
    series: dict[str, set[str]] = {}
    for name, (kind, tags) in defined_metrics().items():
        full = "ray_" + name
        if kind == "Histogram":
            series[full + "_bucket"] = set(tags) | {"le"}
            series[full + "_sum"] = set(tags)
            series[full + "_count"] = set(tags)
        else:
            series[full] = set(tags)
    return series


def test_metric_catalog_is_what_serve_metrics_documents():
    metrics = defined_metrics()
    assert metrics["fastmode_requests_total"] == ("Counter", ("lane", "outcome"))
    for name in ("ttft_seconds", "tpot_seconds", "queue_seconds", "batch_size"):
        assert metrics[f"fastmode_{name}"] == ("Histogram", ("lane",))
    for name in ("hop_seconds", "hop_bytes"):
        assert metrics[f"fastmode_{name}"] == ("Histogram", ("src_chip", "dst_chip", "transport"))


# --- the dashboard's queries ----------------------------------------------------------------------


def substitute(expr: str) -> str:
    for var, value in sorted(VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unknown variable in {expr!r}"
    return expr


def panel_queries() -> list[tuple[str, str]]:
    """``(panel title, PromQL)`` of every target, variables substituted."""
    out = []
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], substitute(target["expr"])))
    return out


def variable_queries() -> list[str]:
    """The series selectors inside the template variables' ``label_values(selector, label)``."""
    out = []
    for var in dashboard()["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
        assert m, f"variable {var['name']}: expected label_values(selector, label), got {query!r}"
        out.append((substitute(m.group(1)), m.group(2)))
    return out


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """``(series name, labels used on it)`` for every series selector in ``expr``: the labels of
    its matchers and of the ``by (...)`` clauses around it (regex-level, after a parse where
    promql_parser is installed)."""
    names = re.findall(r"\b(ray_\w+)\s*(?:\{([^}]*)\})?", expr)
    grouping = {label.strip() for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
                for label in group.split(",") if label.strip()}
    out = []
    for name, matchers in names:
        labels = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers))
        out.append((name, labels | grouping))
    return out


def test_dashboard_queries_name_only_exported_series_and_labels():
    series = exported_series()
    queries = panel_queries()
    assert len(queries) >= 10
    used = set()
    for title, expr in queries:
        found = selectors(expr)
        assert found, f"{title}: no fastmode series in {expr!r}"
        for name, labels in found:
            assert name in series, f"{title}: {name} is not exported by serve/metrics.py"
            extra = labels - series[name] - TARGET_LABELS
            # histogram_quantile groups by le over a _bucket series; nothing else may be unknown.
            assert not extra, f"{title}: {name} has no label(s) {sorted(extra)}"
            used.add(name)
    for selector, label in variable_queries():
        [(name, labels)] = selectors(selector)
        assert name in series and label in series[name] | TARGET_LABELS
        assert not labels - series[name] - TARGET_LABELS
    # Every metric of serve/metrics.py has a panel.
    assert {re.sub(r"_(bucket|sum|count)$", "", n) for n in used} >= {
        "ray_" + name for name in defined_metrics()}


def test_dashboard_quantiles_use_buckets_grouped_by_le():
    for title, expr in panel_queries():
        for m in re.finditer(r"histogram_quantile\(\s*([\d.]+)\s*,(.*)", expr):
            assert 0 < float(m.group(1)) < 1, title
            inner = m.group(2)
            assert "_bucket{" in inner and re.search(r"by\s*\(\s*le\b", inner), f"{title}: {expr}"
        # rate() over counters/histograms only, never a raw cumulative value on a panel.
        for name, _ in selectors(expr):
            assert re.search(rf"rate\({name}\b", expr), f"{title}: {name} without rate()"


def test_dashboard_queries_parse_as_promql():
    promql_parser = pytest.importorskip("promql_parser", reason="pip install promql-parser")
    exprs = [e for _, e in panel_queries()] + [s for s, _ in variable_queries()]
    series = exported_series()
    for expr in exprs:
        ast = promql_parser.parse(expr)  # raises on a syntax error
        seen = []

        def visit(node, seen=seen):
            if type(node).__name__ == "VectorSelector":
                seen.append((node.name, {m.name for m in node.matchers.matchers}))

        promql_parser.walk(ast, visit)
        assert seen, expr
        for name, labels in seen:  # the parser agrees with the regex-level reading
            assert name in series and not labels - series[name] - TARGET_LABELS, (expr, name, labels)


def test_dashboard_panels_have_unique_ids_and_a_valid_layout():
    dash = dashboard()
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    panels = dash["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    cells: dict[tuple[int, int], int] = {}
    for p in panels:
        g = p["gridPos"]
        assert set(g) == {"x", "y", "w", "h"} and all(isinstance(v, int) for v in g.values()), p["title"]
        assert 0 <= g["x"] and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["y"] >= 0 and g["h"] > 0, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"panels {cells[(x, y)]} and {p['id']} overlap at {x},{y}"
                cells[(x, y)] = p["id"]
        if p["type"] == "row":
            continue
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["fieldConfig"]["defaults"]["unit"], p["title"]
    titles = " ".join(p["title"].lower() for p in panels)
    for want in ("requests/s", "rejections", "ttft", "tpot", "queue", "batch", "hop seconds", "hop bytes"):
        assert want in titles, want


def test_dashboard_variables():
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    # One job at a time: a target found by both scrape jobs is never counted twice.
    assert variables["job"]["multi"] is False and variables["job"]["includeAll"] is False
    used = {m for _, e in [(None, t["expr"]) for p in dashboard()["panels"] for t in p.get("targets", [])]
            for m in re.findall(r"\$(\w+)", e)}
    assert used - {"__rate_interval"} <= set(variables)
    for _, expr in panel_queries():
        assert 'job="fastmode"' in expr, expr


# --- prometheus.yml --------------------------------------------------------------------------


def jobs() -> dict[str, dict]:
    cfg = load(PROMETHEUS)
    names = [j["job_name"] for j in cfg["scrape_configs"]]
    assert len(names) == len(set(names))
    return {j["job_name"]: j for j in cfg["scrape_configs"]}


def test_prometheus_scrapes_fastmode_up_on_the_default_metrics_port():
    cfg = load(PROMETHEUS)
    assert cfg["global"]["scrape_timeout"] <= cfg["global"]["scrape_interval"]
    job = jobs()["fastmode"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    [static] = job["static_configs"]
    [target] = static["targets"]
    host, port = target.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) == HTTPConfig().metrics_port == 8080


def test_prometheus_reads_rays_service_discovery_file():
    from ray._private import ray_constants

    [sd] = jobs()["ray"]["file_sd_configs"]
    assert sd["files"] == [f"/tmp/ray/{ray_constants.PROMETHEUS_SERVICE_DISCOVERY_FILE}"]


def test_dashboard_job_values_are_the_scrape_jobs():
    # The dashboard's queries pin job="$job"; its values come from these job names.
    assert set(jobs()) == {"fastmode", "ray"}


def test_promtool_check_config():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not on PATH")
    out = subprocess.run([promtool, "check", "config", "--syntax-only", str(PROMETHEUS)],
                         check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


# --- compose and provisioning ----------------------------------------------------------------


def mounts(service: dict) -> dict[str, Path | str]:
    out = {}
    for volume in service["volumes"]:
        src, dst, *_ = volume.split(":")
        out[dst] = (COMPOSE.parent / src).resolve() if src.startswith((".", "/")) else src
    return out


def test_compose_mounts_the_scrape_config_sd_dir_and_dashboard():
    services = load(COMPOSE)["services"]
    prom, graf = services["prometheus"], services["grafana"]
    config_arg = next(a for a in prom["command"] if a.startswith("--config.file="))
    assert mounts(prom)[config_arg.split("=", 1)[1]] == PROMETHEUS.resolve()
    assert mounts(prom)["/tmp/ray"] == Path("/tmp/ray")
    graf_mounts = mounts(graf)
    assert graf_mounts["/etc/grafana/provisioning"] == (GRAFANA / "provisioning").resolve()
    [provider] = load(PROVIDERS)["providers"]
    dashboards = [dst for dst, src in graf_mounts.items() if src == DASHBOARD.resolve()]
    assert [str(Path(d).parent) for d in dashboards] == [provider["options"]["path"]]
    assert graf["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] == dashboards[0]


def test_compose_listens_on_loopback_only_and_pins_images():
    services = load(COMPOSE)["services"]
    for name, svc in services.items():
        assert "ports" not in svc, f"{name}: host network, nothing to publish"
        assert svc["network_mode"] == "host"
        image, _, tag = svc["image"].rpartition(":")
        assert image and re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{name}: pin a version, got {svc['image']}"
    listen = next(a for a in services["prometheus"]["command"] if a.startswith("--web.listen-address="))
    prom_host, prom_port = listen.split("=", 1)[1].rsplit(":", 1)
    assert prom_host == "127.0.0.1"
    assert services["grafana"]["environment"]["GF_SERVER_HTTP_ADDR"] == "127.0.0.1"
    # Grafana's data source is that Prometheus.
    [ds] = load(DATASOURCES)["datasources"]
    assert ds["type"] == "prometheus" and ds["url"] == f"http://127.0.0.1:{prom_port}"
    assert ds["jsonData"]["timeInterval"] == load(PROMETHEUS)["global"]["scrape_interval"]


def test_provisioning_files_parse():
    for path in (DATASOURCES, PROVIDERS):
        assert load(path)["apiVersion"] == 1, path


def test_compose_schema():
    check = tool("check-jsonschema")
    if check is None:
        pytest.skip("check-jsonschema not on PATH (in the test extra)")
    out = subprocess.run([check, "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
                         check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


# --- a real scrape ----------------------------------------------------------------------------


def scrape_series(url: str) -> dict[str, set[str]]:
    """Series name -> every label name seen on it, from a Prometheus text scrape."""
    import httpx

    out: dict[str, set[str]] = {}
    for line in httpx.get(url, timeout=10).text.splitlines():
        m = re.match(r"^(ray_fastmode_\w+)(?:\{(.*)\})? \S+", line)
        if m:
            out.setdefault(m.group(1), set()).update(re.findall(r'(\w+)="', m.group(2) or ""))
    return out


@pytest.fixture(scope="module")
def piped_app(tmp_path_factory):
    """A ``fastmode up`` whose fast lane is a two-stage pipeline (tp=1 x pp=2), so that the
    dashboard's chip-to-chip hop panels have series whatever the planner picks on this machine (1x1
    has no hops), behind Ray Serve's HTTP proxy (``http.server: serve``, what
    clusters use; the shared app has the gateway's own server)."""
    from tests.serve.conftest import app_with_config, eager_lanes, self_signed

    d = tmp_path_factory.mktemp("dashboard")
    cert, key = self_signed(d)  # and TLS, so that this app also proves Serve's proxy serves https and wss
    with app_with_config(eager_lanes("tp: 1, pp: 2") + f"http: {{server: serve, tls_certfile: {cert}, "
                         f"tls_keyfile: {key}}}\n", d, "--chips", "2", ca_file=cert) as a:
        a.ca_file = cert
        yield a


@pytest.mark.slow
def test_every_dashboard_series_is_in_a_real_scrape(piped_app):
    a = piped_app
    assert a.lane_stats("fast")["layout"]["pp"] == 2
    tls = ssl.create_default_context(cafile=str(a.ca_file))
    with connect(a.ws_url, additional_headers={"Authorization": f"Bearer {a.key}"}, ssl=tls) as ws:  # the proxy, wss
        ws.send(json.dumps({"type": "response.create", "id": "r1", "model": "fastmode-fast", "input": "def f():",
                            "max_output_tokens": 4}))
        events = [json.loads(ws.recv(timeout=60))]
        while events[-1]["type"] not in ("response.completed", "error"):
            events.append(json.loads(ws.recv(timeout=60)))
    assert events[-1]["type"] == "response.completed", events
    status, _ = a.generate(model="fastmode-fast", input="def main():\n", max_output_tokens=8)
    assert status == 200
    # the exact lane's speculative decoding (its counts come with a length-ended response)
    status, events = a.generate(model="fastmode-full", service_tier="exact", input="import os\nimport sys\n",
                                max_output_tokens=24, temperature=0, ignore_eos=True)
    assert status == 200 and events[-1]["type"] == "done" and "speculative" in events[-1], events[-1]
    wanted: dict[str, set[str]] = {}
    for _, expr in panel_queries():
        for name, labels in selectors(expr):
            wanted.setdefault(name, set()).update(labels - TARGET_LABELS)
    deadline = time.monotonic() + 60
    while True:
        got = scrape_series(a.metrics_url)
        missing = {n: sorted(labels - got.get(n, set())) for n, labels in wanted.items()
                   if n not in got or not labels <= got[n]}
        if not missing:
            break
        assert time.monotonic() < deadline, f"not in the scrape (or without these labels): {missing}"
        time.sleep(1)


@pytest.mark.slow
def test_serves_proxy_serves_https_and_wss(piped_app):
    """``http.server: serve`` with a certificate: Ray Serve's proxy speaks TLS only (https, wss; the
    SDK with ``ca_file``), and ``fastmode up`` prints https URLs."""
    import asyncio

    import httpx

    from clients.sdk import AsyncClient
    from tests.serve.conftest import API_KEY

    a = piped_app
    assert f"https://127.0.0.1:{a.port}/v1 " in "".join(a.output)
    status, events = a.generate(model="fastmode-fast", input="def main():\n", max_output_tokens=8)
    assert status == 200 and events[-1]["type"] == "done", events
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{a.port}/health", timeout=10)

    async def main():
        async with AsyncClient(a.ws_url, API_KEY, ca_file=str(a.ca_file)) as client:
            return await client.responses.create(model="fastmode-fast", input="def main():\n", max_output_tokens=8)

    assert asyncio.run(main()).finish_reason in ("length", "stop")
    assert isinstance(ssl.get_server_certificate(("127.0.0.1", a.port)), str)  # it is TLS that answers



@pytest.mark.slow
def test_serves_proxy_keeps_the_gateways_body_limits(piped_app):
    """Behind Ray Serve's proxy the gateway's body limits hold in the app (``serve.body_limits``): a body
    over ``gateway.max_body_bytes`` is 413, declared or streamed, and the app serves on."""
    import httpx

    from serve.config import GatewayConfig

    a, cap = piped_app, GatewayConfig().max_body_bytes
    r = a.client.post("/v1/responses", content=b"x" * (cap + 1), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "invalid_request", r.text[:300]

    def streamed():
        for _ in range(cap // 2**20 + 1):
            yield b" " * 2**20

    try:
        r = a.client.post("/v1/chat/completions", content=streamed(), headers={"content-type": "application/json"})
        assert r.status_code == 413, r.text[:300]
    except httpx.TransportError:  # the proxy may close while the client still sends: refused all the same
        pass
    status, events = a.generate(model="fastmode-fast", input="def main():\n", max_output_tokens=2)
    assert status == 200 and events[-1]["type"] == "done", events
