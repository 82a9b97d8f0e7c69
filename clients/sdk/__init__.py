"""fastmode's Python SDK: responses over one persistent WebSocket (``/v1/responses``).

One connection per client, opened on first use and shared by every call; many responses stream
on it at once. A dropped connection fails the responses in flight with ``ConnectionLost`` and is
reopened (with capped, jittered exponential backoff) by the next call. Errors are typed
(``errors.py``), mapped from the server's stable codes.

Example::

    import asyncio
    from clients.sdk import AsyncClient

    async def main():
        async with AsyncClient("ws://127.0.0.1:8000", api_key="sk-...") as client:
            stream = await client.responses.stream(model="fastmode-fast", input="def main():\\n",
                                                   max_output_tokens=32, temperature=0)
            async for text in stream:          # break here cancels the response on the server
                print(text, end="", flush=True)
            r = stream.result                  # or: r = await stream.final()
            print(r.lane, r.usage.output_tokens, r.timing.ttft_s, r.cost_units)

            r = await client.responses.create(model="fastmode-full", service_tier="priority",
                                              input="import os\\n", max_output_tokens=16)
            # the next turn sends only its new input; the server keeps the conversation (and its KV)
            r = await client.responses.create(model="fastmode-full", previous_response_id=r.id,
                                              input="import sys\\n", max_output_tokens=16)

    asyncio.run(main())

The blocking ``Client`` has the same methods::

    with Client(api_key="sk-...") as client:
        for text in client.responses.stream(model="auto", input="x = 1\\n"):
            print(text, end="")
"""

from .client import AsyncClient, AsyncResponses, Response, ResponseStream, Timing, Usage, responses_url
from .errors import (AuthenticationError, ConnectionDraining, ConnectionFailed, ConnectionLost, FastmodeError,
                     InternalError, InvalidRequest, LaneUnavailable, Overloaded, PreviousResponseNotFound,
                     SlowConsumer, UnknownModel, UnknownServiceTier, UnsupportedParameter, from_code)
from .sync import Client, Responses, Stream

__all__ = ["AsyncClient", "AsyncResponses", "Client", "Responses", "Response", "ResponseStream", "Stream",
           "Timing", "Usage", "responses_url", "FastmodeError", "InvalidRequest", "UnsupportedParameter", "UnknownModel",
           "UnknownServiceTier", "Overloaded", "LaneUnavailable", "SlowConsumer", "AuthenticationError",
           "ConnectionLost", "ConnectionFailed", "ConnectionDraining", "InternalError", "PreviousResponseNotFound",
           "from_code"]
