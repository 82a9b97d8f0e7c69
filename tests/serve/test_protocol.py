"""docs/protocol.md and protocol.schema.json: current, and the examples validate."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from serve.protocol import schema

DOCS = Path(__file__).resolve().parents[2] / "docs"


def validate(event: dict) -> None:
    """Validate one event (either direction) against the committed schema of its type."""
    doc = json.loads((DOCS / "protocol.schema.json").read_text())
    schemas = doc["client_to_server"] | doc["server_to_client"]
    jsonschema.validate(event, schemas[event["type"]])


def test_the_committed_schema_is_current():
    assert json.loads((DOCS / "protocol.schema.json").read_text()) == schema()


EXAMPLES = [json.loads(block) for block in re.findall(r"```json\n(.*?)```", (DOCS / "protocol.md").read_text(), re.S)]


@pytest.mark.parametrize("example", EXAMPLES, ids=[e["type"] for e in EXAMPLES])
def test_every_example_in_the_docs_validates(example):
    validate(example)


def test_the_docs_show_every_event_type():
    doc = schema()
    assert {e["type"] for e in EXAMPLES} == set(doc["client_to_server"]) | set(doc["server_to_client"])


def test_a_wrong_event_fails_validation():
    with pytest.raises(jsonschema.ValidationError):
        validate({"type": "response.output_text.delta", "id": "r", "seq": -1, "delta": "x"})
