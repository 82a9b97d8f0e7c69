"""Typed errors of the SDK, mapped from the server's stable error codes (``docs/protocol.md``).

Every error is a ``FastmodeError`` carrying ``code``, ``message`` and ``retry_after``; catch the
base class to handle them all. A code this SDK does not know maps to the base class itself.
"""

from __future__ import annotations


class FastmodeError(Exception):
    """Base of every SDK error: ``code`` (the server's stable code), ``message``, ``retry_after``
    (seconds, or ``None``) and ``response_id`` (the response it ended, or ``None``)."""

    default_code = "error"

    def __init__(self, code: str | None = None, message: str = "", retry_after: float | None = None,
                 response_id: str | None = None) -> None:
        self.code = code or self.default_code
        self.message = message
        self.retry_after = retry_after
        self.response_id = response_id
        super().__init__(f"{self.code}: {message}" if message else self.code)


class InvalidRequest(FastmodeError):
    """The server refused the request or frame as malformed (a bad field, a prompt too long, ...)."""

    default_code = "invalid_request"


class UnsupportedParameter(InvalidRequest):
    """A request field the server does not implement (it refuses it rather than ignore it)."""

    default_code = "unsupported_parameter"


class UnknownModel(InvalidRequest):
    """The deployment does not serve this ``model``; the message lists the ones it does."""

    default_code = "unknown_model"


class UnknownServiceTier(InvalidRequest):
    """A ``service_tier`` other than ``auto``, ``default``, ``priority`` or ``exact``."""

    default_code = "unknown_service_tier"


class PreviousResponseNotFound(InvalidRequest):
    """``previous_response_id`` names no completed response the server keeps for this connection
    (unknown, evicted, still streaming, or another connection's without ``store``): re-send the
    whole conversation as ``input``."""

    default_code = "previous_response_not_found"


class Overloaded(FastmodeError):
    """The lane (or this connection) is full; retry after ``retry_after`` seconds when given."""

    default_code = "overloaded"


class LaneUnavailable(FastmodeError):
    """The lane's engine is not loaded, has died, or lacks resources."""

    default_code = "lane_unavailable"


class SlowConsumer(FastmodeError):
    """The server cancelled the response because this client read its deltas too slowly."""

    default_code = "slow_consumer"


class AuthenticationError(FastmodeError):
    """The server closed the connection with code 1008: the API key is missing or wrong."""

    default_code = "unauthorized"


class ConnectionLost(FastmodeError):
    """The connection dropped while the response was in flight (its outcome is unknown)."""

    default_code = "connection_lost"


class ConnectionFailed(ConnectionLost):
    """The connection could not be opened, even after retrying with backoff ``max_attempts`` times."""

    default_code = "connection_failed"


class ConnectionDraining(FastmodeError):
    """The connection reached its maximum age; the client retries on a new one by itself."""

    default_code = "connection_draining"


class InternalError(FastmodeError):
    """The server failed (a bug or a bad deployment); not the request's fault."""

    default_code = "internal_error"


CODES: dict[str, type[FastmodeError]] = {
    **dict.fromkeys(["invalid_request", "invalid_json", "invalid_event", "unknown_event", "prompt_too_long",
                     "binary_frame", "frame_too_large", "duplicate_id", "unknown_id",
                     "invalid_sampling_params", "empty_prompt", "token_out_of_range", "duplicate_request"],
                    InvalidRequest),
    "unsupported_parameter": UnsupportedParameter,
    "unknown_model": UnknownModel,
    "unknown_service_tier": UnknownServiceTier,
    "previous_response_not_found": PreviousResponseNotFound,
    **dict.fromkeys(["overloaded", "too_many_in_flight"], Overloaded),
    **dict.fromkeys(["lane_unavailable", "kv_cache_full", "not_enough_chips"], LaneUnavailable),
    "slow_consumer": SlowConsumer,
    **dict.fromkeys(["unauthorized", "forbidden"], AuthenticationError),
    "connection_lost": ConnectionLost,
    "connection_failed": ConnectionFailed,
    "connection_draining": ConnectionDraining,
    **dict.fromkeys(["internal_error", "bad_checkpoint", "invalid_config", "invalid_layout"], InternalError),
}


def from_code(code: str | None, message: str = "", retry_after: float | None = None,
              response_id: str | None = None) -> FastmodeError:
    """The typed error for a server ``code`` (the base ``FastmodeError`` for an unknown one)."""
    cls = CODES.get(code or "", FastmodeError)
    return cls(code or "error", message, retry_after, response_id)


def from_event(event: dict) -> FastmodeError:
    """The typed error for a server ``error`` event."""
    return from_code(event.get("code"), str(event.get("message", "")), event.get("retry_after"),
                     event.get("id"))
