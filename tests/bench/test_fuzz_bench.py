"""``fastmode bench fuzz``'s plumbing on a stand-in for ``tests/serve/test_fuzz.py`` (no application):
the examples reach the tests, each front door's tally and verdict reach the JSON, a failure is
reported with its message and a non-zero exit, and the report's section shows them."""

from __future__ import annotations

import json

from bench.fuzz import run
from bench.report import fuzz_section

STAND_IN = '''
import json, os

def tally(door, answers):
    with open(os.environ["FASTMODE_FUZZ_TALLY"], "a") as f:
        f.write(json.dumps({"front_door": door, "examples": int(os.environ["FASTMODE_FUZZ_EXAMPLES"]),
                            "inputs": sum(answers.values()), "seconds": 0.5, "answers": answers}) + "\\n")

def test_websocket_frames():
    tally("websocket", {"close 1009": 2, "error invalid_json": int(os.environ["FASTMODE_FUZZ_EXAMPLES"])})

def test_http_bodies():
    tally("http", {"400 invalid_request": 3})

def test_grpc_messages():
    assert False, "INTERNAL for b'\\\\x00'"
'''


def test_tallies_and_verdicts_reach_the_results(tmp_path):
    path = tmp_path / "test_stand_in.py"
    path.write_text(STAND_IN)
    result = run(7, 120, str(path))
    doors = result["front_doors"]
    assert result["examples_per_front_door"] == 7 and result["exit_code"] == 1
    assert doors["websocket"]["result"] == "passed" and doors["websocket"]["answers"]["error invalid_json"] == 7
    assert doors["http"] == {**doors["http"], "result": "passed", "inputs": 3}
    assert doors["grpc"]["result"] == "failed" and "INTERNAL" in doors["grpc"]["failure"]
    doc = {"command": "fastmode bench fuzz", "date": "d", "machine": {"cpu_count": 2}, **json.loads(json.dumps(result))}
    text = "\n".join(fuzz_section(doc))
    assert "| websocket | ok | 9 |" in text and "| grpc | **FAILED** |" in text and "grpc failed: `" in text
