"""Typed serving errors, each with a stable ``code`` (the wire contract of every front door).

Lanes and the router raise these where the fault is known; the router turns any exception into
one ``error`` event (``to_event``) so that a stream always ends in ``done`` or ``error``. Errors
of the sharded executor (``sharding.errors``) keep their own codes. The HTTP status of each code
is here too, so the WebSocket, HTTP and gRPC front doors translate in one place.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from sharding.errors import ShardingError


class FastmodeError(Exception):
    """Base of every serving error; ``code`` names the fault, ``status`` is its HTTP status."""

    code: ClassVar[str] = "internal_error"
    status: ClassVar[int] = 500

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after

    def __reduce__(self):  # keep ``retry_after`` across Ray's pickling
        return (_rebuild, (type(self), self.message, self.retry_after))


def _rebuild(cls: type[FastmodeError], message: str, retry_after: float | None) -> FastmodeError:
    return cls(message, retry_after=retry_after)


class ConfigError(FastmodeError, ValueError):
    """A deployment config (YAML or dict) that does not validate; the message names the field."""

    code = "invalid_config"


class InvalidRequest(FastmodeError, ValueError):
    """A request with a missing, mistyped or out-of-range field; the message names the field."""

    code = "invalid_request"
    status = 400


class UnsupportedParameter(InvalidRequest):
    """A request field this server does not implement (never dropped silently); the message names it."""

    code = "unsupported_parameter"


class UnknownModel(FastmodeError, ValueError):
    """A ``model`` that this deployment does not serve; the message lists the ones it does."""

    code = "unknown_model"
    status = 404


class UnknownServiceTier(FastmodeError, ValueError):
    """A ``service_tier`` other than ``auto``, ``default``, ``priority`` or ``exact``."""

    code = "unknown_service_tier"
    status = 400


class Overloaded(FastmodeError):
    """Every replica of the lane has a full batch; retry after ``retry_after`` seconds."""

    code = "overloaded"
    status = 429


class LaneUnavailable(FastmodeError):
    """The lane's engine is not loaded or has died."""

    code = "lane_unavailable"
    status = 503


class NotReady(FastmodeError):
    """The application is still starting: its lanes are loading or warming up (``/health``)."""

    code = "not_ready"
    status = 503


# sharding error code -> HTTP status (everything a request can trigger is the caller's fault).
_SHARDING_STATUS = {"kv_cache_full": 503, "not_enough_chips": 503, "bad_checkpoint": 500,
                    "invalid_config": 500, "invalid_layout": 500}


def describe_validation(errors: list[dict], top: str) -> str:
    """Pydantic's validation errors as one message naming each field (``top`` for the whole)."""
    def one(err: dict) -> str:
        where = ".".join(str(p) for p in err["loc"]) or top
        got = "" if err["type"] == "missing" else f" (got {err.get('input')!r:.80})"
        return f"{where}: {err['msg']}{got}"

    return "; ".join(one(err) for err in errors)


async def first_event(stream, request_id: str | None = None) -> dict[str, Any]:
    """A router stream's first event; an ``error`` event if the router failed outright.

    The HTTP front doors read it before answering, so a request refused before anything streamed
    gets a plain HTTP error with its status."""
    try:
        return await stream.__anext__()
    except Exception as e:  # noqa: BLE001 - still a typed answer
        return to_event(e, request_id)


def unwrap(exc: BaseException) -> BaseException:
    """The original exception inside Ray's wrappers (``RayTaskError`` and its ``cause`` chain)."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (FastmodeError, ShardingError)):
            return exc
        cause = getattr(exc, "cause", None) or exc.__cause__
        if not isinstance(cause, BaseException):
            return exc
        exc = cause
    return exc


MAX_MESSAGE_CHARS = 1000
"""Error messages echo parts of requests (a model name, a field's key); longer ones are clipped, so an
error stays small whatever the request: gRPC refuses trailers over 16 KiB, which 1000 characters stay
under even percent-encoded as 4-byte UTF-8 (12 bytes each)."""


def clip(message: str) -> str:
    """``message``, clipped to ``MAX_MESSAGE_CHARS``."""
    return message if len(message) <= MAX_MESSAGE_CHARS else message[:MAX_MESSAGE_CHARS - 3] + "..."


def to_event(exc: BaseException, request_id: str | None = None) -> dict[str, Any]:
    """The ``error`` event for ``exc``: code, message (clipped), HTTP status and, if any, retry_after."""
    exc = unwrap(exc)
    if isinstance(exc, FastmodeError):
        code, status, message, retry = exc.code, exc.status, exc.message, exc.retry_after
    elif isinstance(exc, ShardingError):
        code, status, message, retry = exc.code, _SHARDING_STATUS.get(exc.code, 400), str(exc), None
    else:
        code, status, message, retry = "internal_error", 500, f"{type(exc).__name__}: {exc}", None
    event: dict[str, Any] = {"type": "error", "id": request_id, "code": code, "message": clip(message),
                             "status": status}
    if retry is not None:
        event["retry_after"] = retry
    return event


def parse_json(text: str | bytes, what: str = "the body") -> Any:
    """``json.loads(text)``, raising ``InvalidRequest`` for anything that is not JSON, including what
    Python's parser gives up on: nesting deeper than its recursion limit (``RecursionError``, not a
    ``ValueError``) and integers of more than 4300 digits. NaN and Infinity are accepted, as Python's
    ``json`` writes them; the request models refuse them where a number must be finite."""
    try:
        return json.loads(text)
    except RecursionError:
        raise InvalidRequest(f"{what} is not valid JSON: nested too deeply") from None
    except ValueError as e:  # UnicodeDecodeError too: bytes that are not UTF-8, -16 or -32
        raise InvalidRequest(f"{what} is not valid JSON: {e}") from None


def validate_mapping(model: type, data: object, origin: str, error: type[Exception]):
    """``model.model_validate(data)`` for a file's top level, raising ``error`` (the caller's typed
    error) prefixed with ``origin`` when ``data`` is not a mapping or a field is invalid."""
    from pydantic import ValidationError

    if not isinstance(data, dict):
        raise error(f"{origin}: the top level must be a mapping, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise error(f"{origin}: " + describe_validation(e.errors(), "(top level)")) from None
