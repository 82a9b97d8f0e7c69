"""API keys: read from the environment or a file (a secret), never from the deployment YAML.

Keys may be off only when the HTTP port is bound to loopback; otherwise the gateway refuses to
start without them. Clients send ``Authorization: Bearer KEY`` on every HTTP request and on the
WebSocket upgrade. A browser cannot set headers on a WebSocket upgrade, so there the key may come
as a subprotocol instead (``KEY_SUBPROTOCOL``).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
from pathlib import Path

from .config import AppConfig
from .errors import ConfigError

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
KEY_SUBPROTOCOL = "fastmode.key."
"""A browser offers ``fastmode.key.`` + the key in base64url (no padding) as a WebSocket subprotocol,
next to the protocol's version, which is the one the server selects (the key is never echoed)."""


def load_keys(config: AppConfig) -> frozenset[str]:
    """The accepted keys (empty: no key needed). Raises ``ConfigError`` on a non-loopback bind
    without keys, or an unreadable key file."""
    auth = config.auth
    keys = {k.strip() for k in os.environ.get(auth.api_keys_env, "").split(",") if k.strip()}
    if auth.api_keys_file:
        try:
            keys |= {line.strip() for line in Path(auth.api_keys_file).read_text().splitlines() if line.strip()}
        except OSError as e:
            raise ConfigError(f"auth.api_keys_file: cannot read {auth.api_keys_file}: {e.strerror or e}") from None
    if not keys and config.http.host not in LOOPBACK:
        raise ConfigError(f"http.host is {config.http.host!r}, not loopback: API keys are required (set "
                          f"{auth.api_keys_env} or auth.api_keys_file)")
    return frozenset(keys)


def authorized(keys: frozenset[str], header: str | None) -> bool:
    """Whether an ``Authorization`` header value carries one of ``keys`` (always, if none)."""
    return key_of(keys, header) is not None


def key_of(keys: frozenset[str], header: str | None) -> str | None:
    """The key of ``keys`` an ``Authorization`` header value carries (``""`` if there are no keys), or
    ``None``: what per-key limits count by."""
    if not keys:
        return ""
    if not header or not header.startswith("Bearer "):
        return None
    token = header[len("Bearer "):].strip().encode("utf-8", "surrogatepass")  # compare_digest wants bytes
    matches = [k for k in keys if hmac.compare_digest(token, k.encode())]  # every key: constant time
    return matches[0] if matches else None


def subprotocol_bearer(offered: list[str]) -> str | None:
    """The ``Authorization`` value carried by an offered ``KEY_SUBPROTOCOL`` (``None`` if none is
    offered, or it is not base64url of UTF-8 text)."""
    for protocol in offered:
        if protocol.startswith(KEY_SUBPROTOCOL):
            encoded = protocol[len(KEY_SUBPROTOCOL):]
            try:
                key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), altchars=b"-_", validate=True).decode()
            except (binascii.Error, ValueError):
                return None
            return f"Bearer {key}"
    return None
