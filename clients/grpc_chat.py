"""``fastmode grpc-chat "prompt"``: stream a completion over the gRPC API (``fastmode chat`` speaks
the WebSocket); ends with time to first token and tokens/s on stderr, or ``--json``."""

from __future__ import annotations

import argparse
import json
import sys
import time

import grpc

from .grpc_client import GrpcClient, error_code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fastmode grpc-chat", description=__doc__.split("\n\n")[0])
    ap.add_argument("prompt")
    ap.add_argument("--model", default="auto")
    ap.add_argument("--service-tier", choices=["priority", "exact", "default", "auto"])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--target", default="127.0.0.1:9000", help="host:port of the gRPC API")
    ap.add_argument("--api-key", help="default: FASTMODE_API_KEY")
    ap.add_argument("--tls", action="store_true", help="the server has grpc.tls_certfile: speak TLS")
    ap.add_argument("--ca-file", help="PEM certificates to trust over TLS (implies --tls; default: gRPC's "
                    "roots)")
    ap.add_argument("--timeout", type=float, help="deadline in seconds")
    ap.add_argument("--json", action="store_true", help="print one JSON object and nothing else")
    args = ap.parse_args(argv)
    params = {"service_tier": args.service_tier, "max_output_tokens": args.max_tokens,
              "temperature": args.temperature}
    with GrpcClient(args.target, args.api_key, tls=args.tls, ca_file=args.ca_file) as client:
        try:
            if args.json:
                print(json.dumps(client.generate(args.model, args.prompt, timeout=args.timeout, **params)))
                return 0
            start, first, last = time.perf_counter(), None, None
            for chunk in client.stream(args.model, args.prompt, timeout=args.timeout, **params):
                if chunk.delta:
                    first = first or time.perf_counter()
                    sys.stdout.write(chunk.delta)
                    sys.stdout.flush()
                last = chunk
        except grpc.RpcError as e:
            print(f"\nfastmode grpc-chat: {e.code().name}: {error_code(e) or ''} {e.details()}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
    t = last.timing
    print(f"\nlane {last.lane} · model {last.model} · {last.usage.output_tokens} tokens · ttft "
          f"{(first - start) * 1e3 if first else float('nan'):.0f} ms · "
          f"{t.decode_tokens_per_s if t.HasField('decode_tokens_per_s') else float('nan'):.0f} tok/s · "
          f"{last.cost_units:.3f} cost units", file=sys.stderr)
    return 0
