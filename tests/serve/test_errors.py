"""Typed errors (``serve.errors``): JSON that Python's parser gives up on is a typed error, and error
messages stay small whatever the request echoed into them."""

from __future__ import annotations

import json

import pytest

from serve.errors import MAX_MESSAGE_CHARS, InvalidRequest, UnknownModel, clip, parse_json, to_event


@pytest.mark.parametrize("text,says", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),  # RecursionError, not a ValueError
    ('{"a": ' * 50_000 + "1" + "}" * 50_000, "nested too deeply"),
    ("1" * 5000, "digits"),  # Python's limit on int conversion
    (b"\xff\xfe\x00", "not valid JSON"),  # not UTF-8 (nor -16, -32)
    ("{oops", "not valid JSON"),
])
def test_what_json_loads_gives_up_on_is_invalid_request(text, says):
    with pytest.raises(InvalidRequest, match=says):
        parse_json(text, "the frame")


def test_nan_and_infinity_parse_as_pythons_json_writes_them():
    assert str(parse_json('{"t": NaN, "u": -Infinity}')) == "{'t': nan, 'u': -inf}"


def test_messages_are_clipped_so_an_error_stays_small():
    """A 20,000-character model name came back whole in ``unknown_model``'s message, over gRPC's 16 KiB
    trailer limit, so the client got RESOURCE_EXHAUSTED without fastmode's error code."""
    event = to_event(UnknownModel(f"model {'m' * 20_000!r} is not served here"))
    assert len(event["message"]) == MAX_MESSAGE_CHARS and event["message"].endswith("...")
    assert clip("short") == "short"
    assert len(json.dumps(clip("\U0001f600" * 5000)).encode()) < 16 * 1024  # even escaped, under the limit
