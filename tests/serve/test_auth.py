"""API keys: from the environment or a file, required off loopback, compared in constant time."""

from __future__ import annotations

import base64
import gc
import warnings

import pytest

from serve.auth import KEY_SUBPROTOCOL, authorized, insecure_warning, load_keys, subprotocol_bearer
from serve.config import load_config
from serve.errors import ConfigError
from serve.up import main as up_main


def test_keys_from_the_environment_and_a_file(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTMODE_API_KEYS", " a1 , b2,,")
    secret = tmp_path / "keys"
    secret.write_text("c3\n\n d4 \n")
    keys = load_keys(load_config({"auth": {"api_keys_file": str(secret)}}))
    assert keys == {"a1", "b2", "c3", "d4"}


def test_no_keys_is_allowed_only_on_loopback(monkeypatch):
    monkeypatch.delenv("FASTMODE_API_KEYS", raising=False)
    assert load_keys(load_config(None)) == frozenset()
    with pytest.raises(ConfigError, match="API keys are required"):
        load_keys(load_config({"http": {"host": "0.0.0.0"}}))
    monkeypatch.setenv("FASTMODE_API_KEYS", "k")
    assert load_keys(load_config({"http": {"host": "0.0.0.0"}})) == {"k"}


def test_fastmode_up_refuses_a_public_bind_without_keys(monkeypatch, capsys):
    monkeypatch.delenv("FASTMODE_API_KEYS", raising=False)
    assert up_main(["--host", "0.0.0.0"]) == 2
    assert "API keys are required" in capsys.readouterr().err


def test_unreadable_key_file():
    with pytest.raises(ConfigError, match="api_keys_file"):
        load_keys(load_config({"auth": {"api_keys_file": "/nonexistent/keys"}}))


@pytest.mark.parametrize("header,ok", [(None, False), ("", False), ("Bearer k1", True), ("Bearer  k2 ", True),
                                       ("Bearer k3", False), ("Basic k1", False), ("k1", False)])
def test_authorized(header, ok):
    assert authorized(frozenset({"k1", "k2"}), header) is ok
    assert authorized(frozenset(), header) is True


def test_a_non_ascii_key_is_refused_not_an_error():
    assert authorized(frozenset({"k1"}), "Bearer kü") is False
    assert authorized(frozenset({"kü"}), "Bearer kü") is True


@pytest.mark.parametrize("key", ["k1", "sk-fastmode-test", "kü?/+=", "a" * 100])
def test_a_browser_sends_the_key_as_a_subprotocol(key):
    encoded = base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")  # what the playground's base64url does
    bearer = subprotocol_bearer(["fastmode.responses.v1", KEY_SUBPROTOCOL + encoded])
    assert bearer == f"Bearer {key}"
    assert authorized(frozenset({key}), bearer) and not authorized(frozenset({"other"}), bearer)


@pytest.mark.parametrize("offered", [[], ["fastmode.responses.v1"], [KEY_SUBPROTOCOL + "%%%"],
                                     [KEY_SUBPROTOCOL + base64.urlsafe_b64encode(b"\xff\xfe").decode()]])
def test_no_or_an_unreadable_key_subprotocol_carries_no_key(offered):
    assert subprotocol_bearer(offered) is None


# --- constant time ------------------------------------------------------------------------------


@pytest.mark.parametrize("header", ["Bearer k1", "Bearer k3", "Bearer a-much-longer-key-than-any-other",
                                    "Bearer "])
def test_every_key_is_compared_as_equal_length_digests(monkeypatch, header):
    # Whichever key matches (first, last or none) and however long the offered key is, the check
    # compares a 32-byte digest with every key's, so its time says neither which nor how long.
    import serve.auth

    calls = []
    real = serve.auth.hmac.compare_digest

    def compare(a, b):
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(serve.auth.hmac, "compare_digest", compare)
    keys = frozenset({"k1", "k2", "k3", "sk-" + "x" * 40})
    assert authorized(keys, header) is (header in ("Bearer k1", "Bearer k3"))
    assert calls == [(32, 32)] * len(keys)


# --- binds: loopback, public with keys, or public by explicit override ---------------------------


def test_a_public_grpc_bind_needs_keys_too(monkeypatch):
    monkeypatch.delenv("FASTMODE_API_KEYS", raising=False)
    with pytest.raises(ConfigError, match="grpc.host is '0.0.0.0', not loopback: API keys are required"):
        load_keys(load_config({"grpc": {"host": "0.0.0.0"}}))
    assert load_keys(load_config({"grpc": {"host": "0.0.0.0", "enabled": False}})) == frozenset()
    for host in ("127.0.0.2", "::1", "localhost"):  # all loopback
        assert load_keys(load_config({"http": {"host": host}, "grpc": {"host": host}})) == frozenset()


def test_a_public_bind_without_keys_only_by_explicit_override(monkeypatch):
    monkeypatch.delenv("FASTMODE_API_KEYS", raising=False)
    public = {"http": {"host": "0.0.0.0"}, "grpc": {"host": "10.1.2.3"}}
    with pytest.raises(ConfigError, match="allow_public_without_keys / fastmode up --insecure-no-auth"):
        load_keys(load_config(public))
    config = load_config(public | {"auth": {"allow_public_without_keys": True}})
    assert load_keys(config) == frozenset()
    warning = insecure_warning(config, frozenset())
    assert warning.startswith("INSECURE: http.host is '0.0.0.0' and grpc.host is '10.1.2.3'")
    assert insecure_warning(config, frozenset({"k"})) is None  # keys set: the override changes nothing
    assert insecure_warning(load_config({"auth": {"allow_public_without_keys": True}}), frozenset()) is None


def test_fastmode_up_insecure_no_auth_is_loudly_warned(monkeypatch, capsys):
    monkeypatch.delenv("FASTMODE_API_KEYS", raising=False)
    assert up_main(["--host", "0.0.0.0", "--insecure-no-auth", "--print-config"]) == 0
    out, err = capsys.readouterr()
    assert "allow_public_without_keys: true" in out
    assert "INSECURE: http.host is '0.0.0.0'" in err and "!" * 100 in err
    assert up_main(["--insecure-no-auth", "--print-config"]) == 0  # loopback: nothing to warn about
    assert "INSECURE" not in capsys.readouterr().err


@pytest.mark.parametrize("front_door", ["gateway", "grpc"])
def test_the_gateway_and_grpc_server_refuse_a_public_bind_without_keys(monkeypatch, front_door):
    # As replicas they get the config from whoever deployed it (serve deploy, KubeRay), not from
    # fastmode up: they check it themselves, before building anything else.
    import asyncio

    from serve.gateway import Gateway
    from serve.rpc.server import GrpcServer

    monkeypatch.delenv("FASTMODE_API_KEYS", raising=False)
    cls = {"gateway": Gateway, "grpc": GrpcServer}[front_door]
    config = load_config({"grpc": {"host": "0.0.0.0"}}).model_dump(mode="json")
    replica = object.__new__(cls)
    with pytest.raises(ConfigError, match="grpc.host is '0.0.0.0', not loopback: API keys are required"):
        asyncio.run(cls.__init__(replica, config, None, None, None, None))
    with warnings.catch_warnings():  # Serve awaits the gateway's async __del__; garbage collection does not
        warnings.simplefilter("ignore", RuntimeWarning)
        del replica
        gc.collect()
