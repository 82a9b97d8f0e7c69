"""``fastmode chat "prompt"``: stream one completion to the terminal over the WebSocket SDK.

Text goes to stdout as it arrives; then a stats line goes to stderr::

    lane fast · model fastmode-fast · 48 tokens · ttft 37 ms · 103 tok/s · 0.05 cost units

``--json`` prints the complete response as one JSON object instead (and nothing else). An error
prints ``fastmode chat: <code>: <message>`` to stderr and exits 1 (2 for usage errors); Ctrl-C
cancels the response on the server and exits 130.

``fastmode chat -i`` is a conversation on one connection: each line read from stdin is a turn that
continues the last one (``previous_response_id``: the server keeps the history and its keys and
values, so a turn sends and prefills only its new line). An empty line or end of input ends it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

from clients.sdk import AsyncClient, FastmodeError, Response, responses_url


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fastmode chat",
                                description="Stream one completion to the terminal, then print its lane, "
                                "model, tokens, time to first token and tokens/s to stderr.")
    p.add_argument("prompt", nargs="?", default=None, help="the prompt ('-' reads it from stdin); with "
                   "--interactive, the first turn (optional)")
    p.add_argument("-i", "--interactive", action="store_true", help="a conversation: every line of stdin is "
                   "a turn continuing the last (previous_response_id); an empty line or EOF ends it")
    p.add_argument("--model", default=None, help="model id: fastmode-full, fastmode-fast or auto "
                   "(default: fastmode-full; with --door, fastmode-fast)")
    p.add_argument("--service-tier", default=None, help="priority, exact or default (fastmode-full's lane)")
    p.add_argument("--max-tokens", type=int, default=None, help="max output tokens (default: the server's)")
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature (0: greedy)")
    p.add_argument("--url", default="ws://127.0.0.1:8000", help="server URL, ws:// or wss:// (https:// works "
                   "too) (default: %(default)s)")
    p.add_argument("--ca-file", default=None, help="PEM certificates to trust for a wss:// server "
                   "(default: the system's trust store)")
    p.add_argument("--api-key", default=None, help="API key (default: $FASTMODE_API_KEY)")
    p.add_argument("--json", action="store_true", help="print the complete response as one JSON object")
    p.add_argument("--door", action="store_true", help="stream from the fast lane's door (GET /v1/door: its "
                   "ring's head chip serves the WebSocket itself): fastmode-fast only, one response (no -i)")
    return p.parse_args(argv)


def stats_line(r: Response) -> str:
    """``lane fast · model fastmode-fast · 48 tokens · ttft 37 ms · 103 tok/s · 0.05 cost units``."""
    parts = [f"lane {r.lane}", f"model {r.model}"]
    if r.usage is not None:
        parts.append(f"{r.usage.output_tokens} tokens")
        if r.usage.cached_tokens:
            parts.append(f"{r.usage.cached_tokens} input tokens cached")
    if r.timing is not None and r.timing.ttft_s is not None:
        parts.append(f"ttft {r.timing.ttft_s * 1000:.0f} ms")
    if r.timing is not None and r.timing.decode_tokens_per_s is not None:
        parts.append(f"{r.timing.decode_tokens_per_s:.0f} tok/s")
    if r.cost_units is not None:
        parts.append(f"{r.cost_units:.2f} cost units")
    if r.speculative:
        s = r.speculative
        parts.append(f"drafts accepted {s['acceptance_rate']:.0%} ({s['tokens_per_step']:.2f} tokens/verify step)")
    if r.finish_reason == "cancelled":
        parts.append("cancelled")
    return " · ".join(parts)


async def chat(args: argparse.Namespace) -> int:
    interrupted = asyncio.Event()
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, interrupted.set)
    except (NotImplementedError, RuntimeError):  # not the main thread, or no signals here
        pass
    params = {"model": args.model, "service_tier": args.service_tier,
              "max_output_tokens": args.max_tokens, "temperature": args.temperature}
    async with AsyncClient(args.url, args.api_key, max_attempts=3, ca_file=args.ca_file, door=args.door) as client:
        if not args.interactive:
            return (await turn(client, {**params, "input": args.prompt}, args, interrupted))[0]
        previous, line = None, args.prompt
        while True:
            if line is None:
                if not args.json:
                    print("> ", end="", file=sys.stderr, flush=True)
                line = (await loop.run_in_executor(None, sys.stdin.readline)).rstrip("\n")
            if not line:
                return 0
            code, r = await turn(client, {**params, "input": line, "previous_response_id": previous}, args,
                                 interrupted)
            if code != 0:
                return code
            previous, line = r.id, None


async def turn(client: AsyncClient, params: dict, args: argparse.Namespace,
               interrupted: asyncio.Event) -> tuple[int, Response | None]:
    """Stream one response to the terminal: (exit code, the response when it completed)."""
    opening = asyncio.ensure_future(client.responses.stream(**params).open())
    waiter = asyncio.ensure_future(interrupted.wait())
    await asyncio.wait([opening, waiter], return_when=asyncio.FIRST_COMPLETED)
    if not opening.done():
        opening.cancel()
        await asyncio.gather(opening, return_exceptions=True)
        return 130, None
    waiter.cancel()
    stream = opening.result()

    async def pump() -> None:
        async for text in stream:
            if not args.json:
                sys.stdout.write(text)
                sys.stdout.flush()

    pumping = asyncio.ensure_future(pump())
    waiter = asyncio.ensure_future(interrupted.wait())
    await asyncio.wait([pumping, waiter], return_when=asyncio.FIRST_COMPLETED)
    if not pumping.done():
        pumping.cancel()
        await asyncio.gather(pumping, return_exceptions=True)
        await stream.cancel()
        if not args.json:
            print(file=sys.stdout, flush=True)
            print(stats_line(stream.result) if stream.result else "cancelled", file=sys.stderr)
        return 130, None
    waiter.cancel()
    pumping.result()  # raises the response's error, if any
    r = stream.result
    if args.json:
        print(json.dumps(r.to_dict()))
    else:
        if r.text and not r.text.endswith("\n"):
            print(flush=True)
        print(stats_line(r), file=sys.stderr)
    return 0, r


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.prompt is None and not args.interactive:
        print("fastmode chat: a prompt is required (or --interactive)", file=sys.stderr)
        return 2
    if args.door and (args.interactive or args.model not in (None, "fastmode-fast")):
        print("fastmode chat: --door serves fastmode-fast's single responses (conversations, -i, and other "
              "models are the gateway's)", file=sys.stderr)
        return 2
    args.model = args.model or ("fastmode-fast" if args.door else "fastmode-full")
    if args.prompt == "-":
        args.prompt = sys.stdin.read()
    if args.ca_file is not None and not responses_url(args.url).startswith("wss://"):
        print(f"fastmode chat: --ca-file is for a wss:// (or https://) server, not {args.url}",
              file=sys.stderr)
        return 2
    try:
        return asyncio.run(chat(args))
    except FastmodeError as e:
        print(f"fastmode chat: {e.code}: {e.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
