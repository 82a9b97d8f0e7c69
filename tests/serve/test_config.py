"""The deployment config: defaults, validation errors that name the field, the serve-deploy form."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from models import TEST_FAST, TEST_FULL
from serve.config import AppConfig, load_config
from serve.errors import ConfigError
from serve.up import main as up_main
from serve.up import serve_config

REPO = Path(__file__).resolve().parents[2]


def test_the_commented_yaml_is_the_builtin_default():
    assert load_config(REPO / "serve" / "fastmode.yaml") == load_config(None)


def test_defaults_serve_the_default_pair_with_the_published_prices():
    from models.builtin import default_pair

    c = load_config(None)
    assert (c.models.full.path, c.models.fast.path) == tuple(map(str, default_pair()))
    assert AppConfig().models.full.path == "builtin:smollm2-135m-instruct"
    assert "full" in c.models.full.id and "fast" in c.models.fast.id
    assert (c.lanes.fast.tp, c.lanes.fast.pp, c.lanes.priority.max_num_seqs, c.lanes.standard.max_num_seqs) == (
        "auto", "auto", 2, 32)
    assert (c.lanes.standard.price, c.lanes.priority.price, c.lanes.fast.price) == (1.0, 6.0, 1.0)
    assert (c.lanes.priority.admission, c.lanes.standard.admission) == ("reject", "queue")
    assert c.http.host == "127.0.0.1"


def test_a_partial_lane_section_keeps_that_lanes_defaults():
    c = load_config({"lanes": {"priority": {"replicas": 3}}})
    assert (c.lanes.priority.replicas, c.lanes.priority.max_num_seqs, c.lanes.priority.price) == (3, 2, 6.0)


def test_relative_model_paths_resolve_against_the_file(tmp_path):
    (tmp_path / "m").symlink_to(TEST_FAST)
    f = tmp_path / "app.yaml"
    f.write_text("models:\n  fast: {id: tiny-fast, path: m}\n")
    assert load_config(f).models.fast.path == str(TEST_FAST.resolve())


@pytest.mark.parametrize("data,says", [
    ({"lanes": {"priority": {"max_num_seqs": 0}}}, "lanes.priority.max_num_seqs"),
    ({"lanes": {"fast": {"transport": "carrier pigeon"}}}, "lanes.fast.transport"),
    ({"lanes": {"fast": {"spin_us": -1}}}, "lanes.fast.spin_us"),
    ({"lanes": {"fast": {"threads_per_chip": 0}}}, "lanes.fast.threads_per_chip"),
    ({"lanes": {"fast": {"pp": 0}}}, "lanes.fast.pp: Value error, must be a positive integer or 'auto' (got 0)"),
    ({"lanes": {"fast": {"tp": "max"}}}, "lanes.fast.tp: Value error, must be a positive integer or 'auto'"),
    ({"lanes": {"turbo": {}}}, "lanes.turbo"),
    ({"lanes": {"standard": {"executor": "ray"}}}, "lanes.standard.executor"),
    ({"lanes": {"exact": {"engine": "tensorrt"}}}, "lanes.exact.engine"),
    ({"lanes": {"exact": {"num_speculative_tokens": 9}}}, "at most 8 on engine 'fastmode'"),
    ({"lanes": {"exact": {"num_speculative_tokens_per_batch_size": [[1, 2, 3]]}}}, "set engine: vllm"),
    ({"lanes": {"exact": {"dtype": "auto"}}}, "engine 'fastmode' takes float32, bfloat16 or float16"),
    ({"lanes": {"exact": {"threads": 0}}}, "lanes.exact.threads"),
    ({"lanes": {"exact": {"draft_vocab": 8}}}, "lanes.exact.draft_vocab"),
    ({"lanes": {"fast": {"vocab": 8}}}, "lanes.fast.vocab"),
    ({"lanes": {"fast": {"vocab": "most"}}}, "lanes.fast.vocab"),
    ({"lanes": {"exact": {"engine": "vllm", "draft_vocab": 1024}}}, "draft_vocab is fastmode's engine's"),
    ({"router": {"auto_threshold": -1}}, "router.auto_threshold"),
    ({"http": {"port": 70000}}, "http.port"),
    ({"models": {"fast": {"id": "fastmode-full", "path": str(TEST_FAST)}}}, "different ids"),
    ({"models": {"fast": {"id": "auto", "path": str(TEST_FAST)}}}, "'auto'"),
    ({"models": {"fast": {"id": "x", "path": "/nonexistent"}}}, "models.fast.path"),
])
def test_bad_configs_name_the_field(data, says):
    with pytest.raises(ConfigError) as e:
        load_config(data)
    assert says in str(e.value)
    assert e.value.code == "invalid_config"


def test_unreadable_or_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("lanes: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("- 1\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(bad)


def test_fastmode_up_refuses_a_bad_config_before_starting_anything(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("lanes: {priority: {max_num_seqs: -1}}\n")
    assert up_main(["--config", str(bad)]) == 2
    assert "lanes.priority.max_num_seqs" in capsys.readouterr().err


def test_the_serve_deploy_config_validates_against_rays_schema_and_builds():
    doc = yaml.safe_load(yaml.safe_dump(serve_config(load_config({"http": {"port": 8100}}))))
    schema = ServeDeploySchema.model_validate(doc)
    app = schema.applications[0]
    assert app.import_path == "serve.app:build_app" and doc["http_options"]["port"] == 8100
    from serve.app import build_app

    built = build_app(app.args)  # what `serve deploy` does with the import path and args
    assert type(built).__name__ == "Application"
    assert load_config(app.args["config"]) == load_config({"http": {"port": 8100}})


def test_the_serve_proxy_runs_only_when_it_listens():
    """``http.server: gateway`` (default): the gateway replica listens, so Serve starts no proxy;
    ``serve``: Serve's proxy on the head listens, as before."""
    assert load_config(None).http.server == "gateway"
    assert serve_config(load_config(None))["proxy_location"] == "Disabled"
    assert serve_config(load_config({"http": {"server": "serve"}}))["proxy_location"] == "HeadOnly"
    with pytest.raises(ConfigError, match="http.server"):
        load_config({"http": {"server": "nginx"}})


def test_fastmode_up_refuses_a_port_in_use_before_starting_anything(capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert up_main(["--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port} is in use" in err


def test_print_config_round_trips(capsys):
    assert up_main(["--print-config", "--port", "9001"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert AppConfig.model_validate(printed) == load_config({"http": {"port": 9001}})


def test_serve_env_reaches_every_replica_and_the_users_env_vars_win():
    from serve.app import actor_options, build
    from serve.config import SERVE_ENV

    config = load_config(None)
    assert config.serve_env == SERVE_ENV and SERVE_ENV["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "0"
    opts = actor_options(config, {"num_cpus": 0, "runtime_env": {"env_vars": {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "0",
                                                                              "X": "1"}, "pip": ["x"]}})
    assert opts["runtime_env"] == {"env_vars": {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "0", "X": "1",
                                                "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0", "FASTMODE_CPUS": "auto"},
                                   "pip": ["x"]}
    assert actor_options(load_config({"serve_env": {}, "cpus": "off"}), {"num_cpus": 0}) == {
        "num_cpus": 0, "runtime_env": {"env_vars": {"FASTMODE_CPUS": "off"}}}
    gateway = build(config)._bound_deployment  # every deployment of the application gets it
    deployments = [gateway] + [a._bound_deployment for a in gateway.init_kwargs.values()]
    assert sorted(d.name for d in deployments) == ["exact-lane", "fast-lane", "gateway", "grpc", "priority-lane",
                                                   "responses", "standard-lane"]
    for d in deployments:
        assert d.ray_actor_options["runtime_env"]["env_vars"] == SERVE_ENV | {"FASTMODE_CPUS": "auto"}, d.name


def test_a_lanes_start_attempts_reach_serve():
    """``lanes.<lane>.max_constructor_retry_count`` is Serve's own option on that lane's deployment;
    unset, Serve's default (3 per replica) applies."""
    from ray.serve._private.constants import DEFAULT_CONSTRUCTOR_RETRY_COUNT

    from serve.app import build

    gateway = build(load_config({"lanes": {"priority": {"max_constructor_retry_count": 1}}}))._bound_deployment
    lanes = {d.name: d for d in (a._bound_deployment for a in gateway.init_kwargs.values()) if d.name.endswith("-lane")}
    assert lanes["priority-lane"]._deployment_config.max_constructor_retry_count == 1
    for name in ("fast-lane", "standard-lane", "exact-lane"):
        assert lanes[name]._deployment_config.max_constructor_retry_count == DEFAULT_CONSTRUCTOR_RETRY_COUNT, name
    with pytest.raises(ConfigError, match="max_constructor_retry_count"):
        load_config({"lanes": {"fast": {"max_constructor_retry_count": 0}}})


# --- TLS files ----------------------------------------------------------------------------------


def test_tls_files_resolve_against_the_config_file_and_load(tmp_path):
    from tests.serve.conftest import self_signed

    self_signed(tmp_path)
    f = tmp_path / "app.yaml"
    f.write_text("http: {tls_certfile: server.crt, tls_keyfile: server.key}\n"
                 "grpc: {tls_certfile: server.crt, tls_keyfile: server.key}\n")
    c = load_config(f)
    assert c.http.tls and c.grpc.tls
    assert c.http.tls_certfile == str(tmp_path / "server.crt")
    assert c.grpc.tls_keyfile == str(tmp_path / "server.key")
    assert not load_config(None).http.tls and not load_config(None).grpc.tls


def test_the_fast_lanes_door_is_on_unless_tls_and_asking_for_it_with_tls_is_refused(tmp_path):
    """``lanes.fast.door`` (serve/lanes/door.py has no TLS): null means on without TLS, off with it;
    true with TLS is refused at load; the fast lane's deployment gets the app's config for it only
    when it is on (its replica reads the keys and http.host from it)."""
    from serve.app import build
    from tests.serve.conftest import self_signed

    cert, key = self_signed(tmp_path)
    tls = {"http": {"tls_certfile": str(cert), "tls_keyfile": str(key)}}
    assert load_config(None).door_on() and not load_config(tls).door_on()
    assert not load_config({"lanes": {"fast": {"door": False}}}).door_on()
    with pytest.raises(ConfigError, match="lanes.fast.door: the fast lane's door has no TLS"):
        load_config({**tls, "lanes": {"fast": {"door": True}}})
    with pytest.raises(ConfigError, match="lanes.fast.door_port"):
        load_config({"lanes": {"fast": {"door_port": 70000}}})

    def fast_lane_door(config):
        gateway = build(config)._bound_deployment
        lanes = {d.name: d for d in (a._bound_deployment for a in gateway.init_kwargs.values()) if d.name.endswith("-lane")}
        return {name: d.init_kwargs.get("door") for name, d in lanes.items()}

    doors = fast_lane_door(load_config(None))
    assert doors["fast-lane"]["http"]["host"] == "127.0.0.1"
    assert all(doors[n] is None for n in ("priority-lane", "standard-lane", "exact-lane"))
    assert fast_lane_door(load_config(tls))["fast-lane"] is None


@pytest.mark.parametrize("section", ["http", "grpc"])
def test_bad_tls_files_are_refused_before_anything_starts(tmp_path, section):
    from tests.serve.conftest import self_signed

    cert, key = self_signed(tmp_path)
    _, other_key = self_signed(tmp_path, "other")
    with pytest.raises(ConfigError, match=f"{section}: Value error, tls_certfile and tls_keyfile go "):
        load_config({section: {"tls_certfile": str(cert)}})
    with pytest.raises(ConfigError, match=f"{section}.tls_keyfile: no file at {tmp_path / 'nope.key'}"):
        load_config({section: {"tls_certfile": str(cert), "tls_keyfile": str(tmp_path / "nope.key")}})
    with pytest.raises(ConfigError, match=f"{section}.tls_certfile, tls_keyfile: cannot load them"):
        load_config({section: {"tls_certfile": str(cert), "tls_keyfile": str(other_key)}})  # not its key
    with pytest.raises(ConfigError, match="cannot load them"):
        load_config({section: {"tls_certfile": str(key), "tls_keyfile": str(key)}})  # not a certificate


def test_serve_deploy_config_gives_serves_proxy_the_certificate(tmp_path):
    # http.server: serve: Ray Serve's proxy listens, and serves https with the same files.
    from tests.serve.conftest import self_signed

    cert, key = self_signed(tmp_path)
    config = load_config({"http": {"server": "serve", "tls_certfile": str(cert), "tls_keyfile": str(key)}})
    out = serve_config(config)
    assert out["http_options"] == {"host": "127.0.0.1", "port": 8000, "ssl_certfile": str(cert),
                                   "ssl_keyfile": str(key)}
    schema = ServeDeploySchema.model_validate(out)
    assert (schema.http_options.ssl_certfile, schema.http_options.ssl_keyfile) == (str(cert), str(key))
    assert "ssl_certfile" not in serve_config(load_config(None))["http_options"]


def test_vllm_lanes_run_the_model_in_the_engine_core_on_one_chip_else_as_vllm_chooses():
    """``executor: auto`` is vLLM's ``uni`` where the engine has one chip (faster on CPU, where vLLM
    would force ``mp``: docs/lanes.md), vLLM's default when engine_args shard it."""
    from serve.lanes.vllm_engine import executor_backend

    lanes = load_config(None).lanes
    assert {executor_backend(lane) for lane in (lanes.priority, lanes.standard, lanes.exact)} == {"uni"}
    sharded = load_config({"lanes": {"standard": {"engine_args": {"tensor_parallel_size": 2}}}}).lanes.standard
    assert executor_backend(sharded) is None
    assert executor_backend(load_config({"lanes": {"standard": {"executor": "mp"}}}).lanes.standard) == "mp"


def test_the_exact_lanes_vllm_fields_apply_with_its_vllm_engine():
    lanes = load_config({"lanes": {"exact": {"engine": "vllm", "num_speculative_tokens": 12,
                                             "num_speculative_tokens_per_batch_size": [[1, 2, 3]]}}}).lanes
    assert lanes.exact.engine == "vllm" and lanes.exact.num_speculative_tokens == 12
    assert load_config({}).lanes.exact.engine == "fastmode"
