"""``listen``: serve an ASGI app on a TCP port from inside a Serve replica (the gateway's own server).

Behind Ray Serve's HTTP proxy, every request and every streamed chunk of a response crosses two
processes (proxy -> replica, then replica -> proxy as a streamed item, about 0.5 ms of CPU each on
this machine). With ``http.server: gateway`` the gateway replica listens itself, so a token's chunk
travels lane replica -> gateway -> client. The port is not shared (no ``SO_REUSEPORT``): a second
server on it fails at once instead of silently taking half of the connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any

import uvicorn


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handlers: the replica's process owns its signals."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


async def listen(app: Any, host: str, port: int, *, ws_max_size: int, keep_alive_s: float = 5.0,
                 tls_certfile: str | None = None, tls_keyfile: str | None = None
                 ) -> tuple[uvicorn.Server, asyncio.Task]:
    """Start serving ``app`` on ``host:port``; return once it accepts connections. With a
    certificate and its key (PEM files), the port speaks TLS only (https, wss).

    Raises ``OSError`` if the port cannot be bound (another server has it), ``ssl.SSLError`` if the
    certificate and key do not load.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"the gateway cannot listen on {host}:{port}: {e.strerror}") from e
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    # Frames the gateway refuses itself (max_frame_bytes, with an error event) must reach it first:
    # uvicorn's own limit is set above it. Compression is off: deltas are short JSON, and deflate
    # per message costs more CPU than it saves on a LAN.
    server = _Server(uvicorn.Config(app, lifespan="off", access_log=False, log_config=None,
                                    ws="websockets", ws_max_size=ws_max_size, ws_per_message_deflate=False,
                                    timeout_keep_alive=keep_alive_s, ssl_certfile=tls_certfile,
                                    ssl_keyfile=tls_keyfile))
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()  # raises what stopped it
            raise OSError(f"the HTTP server on {host}:{port} stopped while starting")
        await asyncio.sleep(0.01)
    return server, task
