"""API keys: from the environment or a file, required off loopback, compared in constant time."""

from __future__ import annotations

import base64

import pytest

from serve.auth import KEY_SUBPROTOCOL, authorized, load_keys, subprotocol_bearer
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
