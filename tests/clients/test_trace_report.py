"""``fastmode trace``: on a real span file of the fast lane at tp=2 x pp=2, and on hand-made OTLP JSON."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from clients import trace_report
from clients.trace_report import main

REPO = Path(__file__).resolve().parents[2]
REAL = Path(__file__).parent / "data" / "trace_tp2pp2.jsonl"
"""Written by ``FASTMODE_TRACE_FILE`` from ``fastmode up --chips 4`` with the fast lane at tp=2 x pp=2:
three requests to fastmode-fast (24, 24 and 80 output tokens); the fast lane's spans only."""

PNG = b"\x89PNG\r\n\x1a\n"


def run_json(capsys, *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    out = capsys.readouterr().out
    return json.loads(out)


def walk_spans(path: Path):
    """Every span of a JSON-lines OTLP file, by the simplest walk: (name, {key: raw AnyValue})."""
    for line in path.read_text().splitlines():
        if line.strip():
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        yield s, {kv["key"]: next(iter(kv["value"].values()))
                                  for kv in s.get("attributes", [])}


def check_png(path: Path, min_px: int = 200) -> None:
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG
    img = matplotlib.image.imread(path)
    assert img.shape[0] >= min_px and img.shape[1] >= min_px
    assert img.std() > 0.01  # not a blank canvas


# ------------------------------------------------------------------------------------- the real file


def test_the_real_file_per_pair_counts_match_an_independent_walk(capsys, tmp_path):
    expected = Counter()
    steps = 0
    layouts = set()
    for s, a in walk_spans(REAL):
        if s["name"].startswith("fastmode.hop "):
            expected[(a["fastmode.hop.src_chip"], a["fastmode.hop.dst_chip"],
                      int(a["fastmode.hop.src_stage"]), int(a["fastmode.hop.dst_stage"]))] += 1
        elif s["name"] in ("fastmode.prefill", "fastmode.decode") and "fastmode.tp" in a:
            steps += 1
            layouts.add((int(a["fastmode.tp"]), int(a["fastmode.pp"]), a["fastmode.transport"]))
    assert expected and steps

    r = run_json(capsys, str(REAL), "--out", str(tmp_path))
    got = Counter({(p["src"], p["dst"], p["src_stage"], p["dst_stage"]): p["hops"] for p in r["pairs"]})
    assert got == expected
    assert r["hop_spans"] == sum(expected.values()) and r["step_spans"] == steps
    assert {(x["tp"], x["pp"], x["transport"]) for x in r["layouts"]} == layouts == {(2, 2, "actor_calls")}
    assert r["traces"] == r["requests"] == 3
    stages = {(p["src_stage"], p["dst_stage"]) for p in r["pairs"]}
    assert {(-1, 0), (0, 1), (1, -1)} <= stages  # driver -> stage 0 -> stage 1 -> driver
    for p in r["pairs"]:
        assert 0 < p["p50_ms"] <= p["p99_ms"]
        assert p["share"] is not None and 0 < p["share"] <= 1
        assert p["bytes_total"] > 0 and p["bytes_mean"] == pytest.approx(p["bytes_total"] / p["hops"])
    # the default waterfall trace is the one with the most steps: the 80-token request's
    assert r["waterfall_trace_id"] and len(r["waterfall_trace_id"]) == 32
    check_png(Path(r["heatmap"]))
    check_png(Path(r["waterfall"]))
    assert {f.name for f in tmp_path.iterdir()} == {"heatmap.png", "waterfall.png"}


def test_the_real_file_table_and_default_out_dir(capsys, tmp_path):
    copy = tmp_path / "spans.jsonl"
    copy.write_bytes(REAL.read_bytes())
    assert main([str(copy)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("3 traces · 3 requests · ") and "tp2 x pp2 actor_calls" in lines[0]
    assert lines[2].split()[:3] == ["src", "->", "dst"] and "p99 ms" in lines[2] and "share" in lines[2]
    assert any(line.startswith("driver -> ") for line in lines)
    check_png(tmp_path / "spans_report" / "heatmap.png")
    check_png(tmp_path / "spans_report" / "waterfall.png")


def test_every_input_shape_gives_the_same_table(capsys, tmp_path):
    """JSON lines with base64 ids; one document (a Collector's); an array; hex ids and snake_case."""
    docs = [json.loads(line) for line in REAL.read_text().splitlines() if line.strip()]
    one = tmp_path / "one.json"
    one.write_text(json.dumps({"resourceSpans": [rs for d in docs for rs in d["resourceSpans"]]}, indent=2))
    array = tmp_path / "array.json"
    array.write_text(json.dumps(docs))

    def to_hex(d):
        if isinstance(d, dict):
            ids = ("traceId", "spanId", "parentSpanId")
            return {k: base64.b64decode(v).hex() if k in ids and v else to_hex(v) for k, v in d.items()}
        return [to_hex(x) for x in d] if isinstance(d, list) else d

    hexed = tmp_path / "hex.jsonl"
    hexed.write_text("".join(json.dumps(to_hex(d)) + "\n" for d in docs))
    results = []
    for path in (REAL, one, array, hexed):
        r = run_json(capsys, str(path), "--out", str(tmp_path / path.stem))
        results.append({k: r[k] for k in ("traces", "requests", "step_spans", "hop_spans", "pairs",
                                          "waterfall_trace_id")})
    assert all(r == results[0] for r in results[1:])


def test_trace_id_picks_the_waterfall_trace(capsys, tmp_path):
    traces = Counter()
    for s, _ in walk_spans(REAL):
        if s["name"] in ("fastmode.prefill", "fastmode.decode"):
            traces[base64.b64decode(s["traceId"]).hex()] += 1
    fewest = min(traces, key=traces.get)
    def picked(*argv: str) -> str:
        return run_json(capsys, str(REAL), "--out", str(tmp_path), *argv)["waterfall_trace_id"]

    assert picked() == max(traces, key=traces.get)
    assert picked("--trace-id", fewest) == fewest
    assert picked("--trace-id", fewest[:12].upper()) == fewest  # a unique prefix
    assert picked("--trace-id", base64.b64encode(bytes.fromhex(fewest)).decode()) == fewest
    assert main([str(REAL), "--out", str(tmp_path), "--trace-id", "f" * 32]) == 1
    assert "no step spans in trace" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- hand-made spans


def _span(trace: str, span: str, parent: str, name: str, start_ms: float, end_ms: float, **attrs) -> dict:
    def value(v):
        if isinstance(v, bool):
            return {"boolValue": v}
        if isinstance(v, int):
            return {"intValue": str(v)}
        if isinstance(v, float):
            return {"doubleValue": v}
        return {"stringValue": v}

    def key(k: str) -> str:  # fastmode_hop_src_chip -> fastmode.hop.src_chip
        return k.replace("fastmode_hop_", "fastmode.hop.").replace("fastmode_", "fastmode.")

    t0 = 1_700_000_000_000_000_000
    return {"traceId": trace, "spanId": span, "parentSpanId": parent, "name": name,
            "startTimeUnixNano": str(t0 + int(start_ms * 1e6)),
            "endTimeUnixNano": str(t0 + int(end_ms * 1e6)),
            "attributes": [{"key": key(k), "value": value(v)} for k, v in attrs.items()]}


def _hop(trace, span, parent, src, dst, s_st, d_st, start_ms, ms, nbytes):
    return _span(trace, span, parent, f"fastmode.hop {src}->{dst}", start_ms, start_ms + ms,
                 fastmode_hop_src_chip=src, fastmode_hop_dst_chip=dst, fastmode_hop_src_stage=s_st,
                 fastmode_hop_dst_stage=d_st, fastmode_hop_bytes=nbytes, fastmode_hop_transport="actor_calls",
                 fastmode_hop_seconds=ms / 1e3)


def handmade(path: Path) -> Path:
    """Two requests at tp=1 x pp=2 (steps of 10 and 4 ms; then 5 ms), and a vLLM lane's step span."""
    A, B, C = "a" * 32, "b" * 32, "c" * 32
    layout = {"fastmode_tp": 1, "fastmode_pp": 2, "fastmode_transport": "actor_calls"}
    c0, c1 = "n/chip0", "n/chip1"
    spans = [
        _span(A, "1" * 16, "", "fastmode.lane fast", 0, 20),
        _span(A, "2" * 16, "1" * 16, "fastmode.prefill", 0, 10, fastmode_step=0, **layout),
        _hop(A, "21".ljust(16, "0"), "2" * 16, "driver", c0, -1, 0, 0, 1.0, 100),
        _hop(A, "22".ljust(16, "0"), "2" * 16, c0, c1, 0, 1, 5, 2.0, 1000),
        _hop(A, "23".ljust(16, "0"), "2" * 16, c1, "driver", 1, -1, 9, 0.5, 8),
        _span(A, "3" * 16, "1" * 16, "fastmode.decode", 10, 14, fastmode_step=1, **layout),
        _hop(A, "31".ljust(16, "0"), "3" * 16, "driver", c0, -1, 0, 10, 1.0, 8),
        _hop(A, "32".ljust(16, "0"), "3" * 16, c0, c1, 0, 1, 11, 1.0, 1000),
        _hop(A, "33".ljust(16, "0"), "3" * 16, c1, "driver", 1, -1, 13, 0.5, 8),
        _span(B, "4" * 16, "5" * 16, "fastmode.prefill", 0, 5, fastmode_step=0, **layout),
        _hop(B, "41".ljust(16, "0"), "4" * 16, "driver", c0, -1, 0, 0, 3.0, 60),
        _span(C, "6" * 16, "7" * 16, "fastmode.prefill", 0, 50),  # a vLLM lane's: no layout, no hops
    ]
    doc = {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"scope": {"name": "fastmode"},
                                                                               "spans": spans}]}]}
    path.write_text(json.dumps(doc))
    return path


def test_handmade_numbers(capsys, tmp_path):
    r = run_json(capsys, str(handmade(tmp_path / "h.json")), "--out", str(tmp_path / "out"))
    assert (r["traces"], r["requests"], r["step_spans"], r["hop_spans"]) == (2, 2, 3, 7)
    assert r["layouts"] == [{"tp": 1, "pp": 2, "transport": "actor_calls", "steps": 3}]
    rows = {(p["src"], p["dst"]): p for p in r["pairs"]}
    assert [(p["src"], p["dst"]) for p in r["pairs"]] == [("driver", "n/chip0"), ("n/chip0", "n/chip1"),
                                                          ("n/chip1", "driver")]  # in pipeline order
    d = rows[("driver", "n/chip0")]
    assert (d["src_stage"], d["dst_stage"], d["hops"], d["bytes_total"]) == (-1, 0, 3, 168)
    assert d["bytes_mean"] == pytest.approx(56)
    assert (d["p50_ms"], d["p99_ms"]) == pytest.approx((1.0, 3.0))
    assert d["share"] == pytest.approx((1 + 1 + 3) / (10 + 4 + 5))
    m = rows[("n/chip0", "n/chip1")]
    assert (m["hops"], m["p50_ms"], m["p99_ms"]) == (2, pytest.approx(2.0), pytest.approx(2.0))
    assert m["share"] == pytest.approx(3 / 14)
    assert rows[("n/chip1", "driver")]["share"] == pytest.approx(1 / 14)
    assert r["waterfall_trace_id"] == "a" * 32
    check_png(Path(r["heatmap"]))
    check_png(Path(r["waterfall"]))


def test_the_waterfall_shortens_idle_gaps_between_sampled_steps():
    """Steps 0..8 back to back, then step 64 after 3 s: two runs, the gap drawn short, true ms on the
    ticks."""
    extents = [(10.0 * i, 10.0 * i + 9) for i in range(9)] + [(3000.0, 3009.0)]
    axis = trace_report.TimeAxis.of(extents)
    assert axis.groups == [[0.0, 89.0], [3000.0, 3009.0]]
    assert axis.x(3000.0, 1) - axis.x(89.0, 0) == axis.gap < 100 and axis.width < 200
    pos, labels = axis.ticks()
    assert labels[0] == "0" and "3000" in labels and pos == sorted(pos)
    assert trace_report.TimeAxis.of([(0.0, 5.0), (5.5, 9.0)]).groups == [[0.0, 9.0]]  # no gap: one run


def test_ids_decode_from_hex_or_base64():
    raw = bytes(range(16))
    assert trace_report.normalize_id(raw.hex(), 16) == raw.hex()
    assert trace_report.normalize_id(raw.hex().upper(), 16) == raw.hex()
    assert trace_report.normalize_id(base64.b64encode(raw).decode(), 16) == raw.hex()
    assert trace_report.normalize_id(base64.urlsafe_b64encode(b"\xfb" * 8).decode(), 8) == "fb" * 8
    assert trace_report.normalize_id("", 8) == "" and trace_report.normalize_id(None, 8) == ""


def test_attribute_values():
    av = trace_report.any_value
    assert av({"intValue": "12"}) == 12 and av({"doubleValue": 0.5}) == 0.5
    assert av({"boolValue": True}) is True and av({"doubleValue": "Infinity"}) > 1e308
    assert av({"doubleValue": "NaN"}) != av({"doubleValue": "NaN"})
    assert av({"arrayValue": {"values": [{"stringValue": "length"}, {"intValue": "3"}]}}) == ["length", 3]
    assert av({"arrayValue": {}}) == [] and av({"string_value": "snake"}) == "snake" and av({}) is None


# ------------------------------------------------------------------------------------- errors


def test_errors_exit_1_with_a_message(capsys, tmp_path):
    def err(*argv: str) -> str:
        assert main([*argv, "--out", str(tmp_path / "out")]) == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        return captured.err

    assert err(str(tmp_path / "missing.jsonl")).startswith("fastmode trace: no such file: ")
    (tmp_path / "text.txt").write_text("hello\nworld\n")
    assert "not JSON" in err(str(tmp_path / "text.txt"))
    (tmp_path / "half.jsonl").write_text(REAL.read_text().splitlines()[0] + "\n{\"resourceSpans\": [\n")
    assert "line 2" in err(str(tmp_path / "half.jsonl"))
    (tmp_path / "empty.jsonl").write_text("")
    assert "empty" in err(str(tmp_path / "empty.jsonl"))
    (tmp_path / "scalar.json").write_text("42")
    assert "expected an OTLP" in err(str(tmp_path / "scalar.json"))
    other = tmp_path / "other.jsonl"  # real OTLP JSON, but no fast-lane spans
    lines = [json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [
        _span("d" * 32, "1" * 16, "", "text_completion fastmode-full", 0, 5)]}]}]}), json.dumps({})]
    other.write_text("\n".join(lines) + "\n")
    assert "no fastmode step or hop spans" in err(str(other))
    steps_only = tmp_path / "steps_only.json"
    steps_only.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [
        _span("d" * 32, "1" * 16, "", "fastmode.prefill", 0, 5, fastmode_tp=1, fastmode_pp=1)]}]}]}))
    assert "no hop spans" in err(str(steps_only))
    assert "is a directory" in err(str(tmp_path))


def test_usage_errors_exit_2_through_the_cli():
    for argv in ([], [str(REAL), "--bogus"]):
        p = subprocess.run([sys.executable, "-m", "clients.cli", "trace", *argv], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "usage: fastmode trace" in p.stderr, p.stderr
    p = subprocess.run([sys.executable, "-m", "clients.cli", "--help"], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert "trace" in p.stdout and "heatmap" in p.stdout


def test_the_cli_runs_it(tmp_path):
    p = subprocess.run([sys.executable, "-m", "clients.cli", "trace", str(REAL), "--out", str(tmp_path),
                        "--json"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["hop_spans"] > 0
