"""API keys: read from the environment or a file (a secret), never from the deployment YAML.

Keys may be off only when the HTTP port is bound to loopback; otherwise the gateway refuses to
start without them. Clients send ``Authorization: Bearer KEY`` on every HTTP request and on the
WebSocket upgrade.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from .config import AppConfig
from .errors import ConfigError

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


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
    if not keys:
        return True
    if not header or not header.startswith("Bearer "):
        return False
    token = header[len("Bearer "):].strip()
    return any(hmac.compare_digest(token, k) for k in keys)
