"""A small client for fastmode's internal gRPC API (``fastmode.v1.Inference``).

    from clients.grpc_client import GrpcClient
    with GrpcClient("127.0.0.1:9000", api_key="...") as client:
        for chunk in client.stream(model="fastmode-fast", input="def main():\\n", max_output_tokens=32):
            print(chunk.delta, end="")
        print(chunk.usage, chunk.timing)  # the last chunk carries them

Errors are ``grpc.RpcError``s (``.code()``, ``.details()``); ``error_code(e)`` gives fastmode's
error code from the trailers, ``retry_after(e)`` the overload hint.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import grpc

from serve.rpc import inference_pb2 as pb
from serve.rpc import inference_pb2_grpc as pb_grpc


def request(model: str, input: str | list[dict[str, str]], **params: Any) -> pb.GenerateRequest:
    """A ``GenerateRequest`` from the WebSocket-style fields (``max_output_tokens``, ``stop``, ...)."""
    req = pb.GenerateRequest(model=model, **{k: v for k, v in params.items() if v is not None and k != "metadata"})
    if isinstance(input, str):
        req.text = input
    else:
        req.messages.messages.extend(pb.Message(**m) for m in input)
    for k, v in (params.get("metadata") or {}).items():
        req.metadata[k] = v
    return req


def error_code(e: grpc.RpcError) -> str | None:
    """fastmode's error code (as on the WebSocket) of a failed call, if the server sent one."""
    return dict(e.trailing_metadata() or ()).get("fastmode-error-code")


def retry_after(e: grpc.RpcError) -> float | None:
    value = dict(e.trailing_metadata() or ()).get("retry-after")
    return None if value is None else float(value)


class GrpcClient:
    """Blocking client over one channel; ``api_key`` defaults to ``FASTMODE_API_KEY``.

    ``tls``: speak TLS to a server with ``grpc.tls_certfile``, trusting gRPC's default roots;
    ``ca_file``: PEM certificates to trust instead (implies ``tls``)."""

    def __init__(self, target: str = "127.0.0.1:9000", api_key: str | None = None, *, tls: bool = False,
                 ca_file: str | None = None) -> None:
        if tls or ca_file is not None:
            roots = Path(ca_file).read_bytes() if ca_file is not None else None
            self.channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=roots))
        else:
            self.channel = grpc.insecure_channel(target)
        self.stub = pb_grpc.InferenceStub(self.channel)
        key = api_key if api_key is not None else os.environ.get("FASTMODE_API_KEY")
        self.metadata = (("authorization", f"Bearer {key}"),) if key else ()

    def stream(self, model: str, input: str | list[dict[str, str]], *, timeout: float | None = None,
               traceparent: str | None = None, **params: Any):
        """The call's chunk iterator (cancel it with ``.cancel()``); the last chunk has ``last`` set."""
        metadata = self.metadata + ((("traceparent", traceparent),) if traceparent else ())
        return self.stub.Generate(request(model, input, **params), timeout=timeout, metadata=metadata)

    def generate(self, model: str, input: str | list[dict[str, str]], **params: Any) -> dict[str, Any]:
        """The whole response: text, lane, model, finish_reason, usage, timing, cost_units (and on the
        exact lane ``speculative``: its drafts and their acceptance)."""
        text, last = [], None
        for chunk in self.stream(model, input, **params):
            text.append(chunk.delta)
            last = chunk
        out = {"id": last.id, "text": "".join(text), "lane": last.lane, "model": last.model,
                "finish_reason": last.finish_reason, "cost_units": last.cost_units,
                "usage": {"input_tokens": last.usage.input_tokens, "output_tokens": last.usage.output_tokens,
                          "total_tokens": last.usage.total_tokens, "cached_tokens": last.usage.cached_tokens},
                "timing": {"total_s": last.timing.total_s} | {
                    f: getattr(last.timing, f) for f in ("ttft_s", "engine_ttft_s", "decode_tokens_per_s")
                    if last.timing.HasField(f)}}
        if last.HasField("speculative"):
            s = last.speculative
            out["speculative"] = {f: getattr(s, f) for f in ("draft_tokens", "verify_steps", "drafted", "accepted",
                                                              "acceptance_rate", "tokens_per_step")}
        return out

    def models(self) -> list[dict[str, Any]]:
        resp = self.stub.ListModels(pb.ListModelsRequest(), metadata=self.metadata)
        return [{"id": m.id, "lanes": list(m.lanes)} for m in resp.models]

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> GrpcClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

