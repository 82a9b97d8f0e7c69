"""API keys: read from the environment or a file (a secret), never from the deployment YAML.

Keys may be off only when the HTTP port and the gRPC port are bound to loopback; otherwise
``fastmode up``, the gateway and the gRPC server refuse to start without them, unless
``auth.allow_public_without_keys`` (``fastmode up --insecure-no-auth``) says to serve anyway, which
every one of them warns about. Clients send ``Authorization: Bearer KEY`` on every HTTP request and
on the WebSocket upgrade. A browser cannot set headers on a WebSocket upgrade, so there the key
may come as a subprotocol instead (``KEY_SUBPROTOCOL``).

A key is checked in constant time: the offered key and every accepted key are hashed to SHA-256
(so every comparison is between 32-byte strings, whatever the lengths), and the digest is compared
with every accepted key's, without stopping at a match, so the time taken says neither which key
matched nor how long any key is.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import os
from pathlib import Path

from .config import AppConfig
from .errors import ConfigError

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
KEY_SUBPROTOCOL = "fastmode.key."
"""A browser offers ``fastmode.key.`` + the key in base64url (no padding) as a WebSocket subprotocol,
next to the protocol's version, which is the one the server selects (the key is never echoed)."""


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps a port to this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host in LOOPBACK:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def public_binds(config: AppConfig) -> list[str]:
    """The config fields that bind a port beyond loopback (``http.host``, ``grpc.host`` if enabled)."""
    binds = [("http.host", config.http.host)]
    if config.grpc.enabled:
        binds.append(("grpc.host", config.grpc.host))
    return [f"{field} is {host!r}" for field, host in binds if not is_loopback(host)]


def load_keys(config: AppConfig) -> frozenset[str]:
    """The accepted keys (empty: no key needed). Raises ``ConfigError`` on a non-loopback bind
    without keys (unless ``auth.allow_public_without_keys``: then see ``insecure_warning``), or an
    unreadable key file."""
    auth = config.auth
    keys = {k.strip() for k in os.environ.get(auth.api_keys_env, "").split(",") if k.strip()}
    if auth.api_keys_file:
        try:
            keys |= {line.strip() for line in Path(auth.api_keys_file).read_text().splitlines() if line.strip()}
        except OSError as e:
            raise ConfigError(f"auth.api_keys_file: cannot read {auth.api_keys_file}: {e.strerror or e}") from None
    public = public_binds(config)
    if not keys and public and not auth.allow_public_without_keys:
        raise ConfigError(f"{' and '.join(public)}, not loopback: API keys are required (set "
                          f"{auth.api_keys_env} or auth.api_keys_file; or, to serve anyone who reaches "
                          f"the port, auth.allow_public_without_keys / fastmode up --insecure-no-auth)")
    return frozenset(keys)


def insecure_warning(config: AppConfig, keys: frozenset[str]) -> str | None:
    """What to warn about at every start when a port is open beyond loopback without keys
    (``auth.allow_public_without_keys``); ``None`` when it is not."""
    public = public_binds(config)
    if keys or not public:
        return None
    return (f"INSECURE: {' and '.join(public)} and no API keys are set (auth.allow_public_without_keys): "
            "anyone who can reach the port can use every lane")


def _digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


def authorized(keys: frozenset[str], header: str | None) -> bool:
    """Whether an ``Authorization`` header value carries one of ``keys`` (always, if none).

    Constant time in the key: see the module docstring."""
    return key_of(keys, header) is not None


def key_of(keys: frozenset[str], header: str | None) -> str | None:
    """The key of ``keys`` an ``Authorization`` header value carries (``""`` if there are no keys), or
    ``None``: what per-key limits count by. Compares against every key, with no early exit."""
    if not keys:
        return ""
    if not header or not header.startswith("Bearer "):
        return None
    offered = _digest(header[len("Bearer "):].strip().encode("utf-8", "surrogatepass"))
    match = None
    for key in keys:  # every key, no early exit: the time does not say which one matched
        if hmac.compare_digest(offered, _digest(key)):
            match = key
    return match


def owner_of(key: str) -> str:
    """Who owns what a caller with ``key`` (from ``key_of``) stores: a digest of the key, never the key
    itself (``""`` when there are no keys: every caller is one). A stored response is found only by its
    owner's key (``serve.conversation``)."""
    return hashlib.sha256(b"fastmode.owner:" + key.encode("utf-8", "surrogatepass")).hexdigest()[:32] if key else ""


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
