"""``bench.report``: the published report from the kept results, with no machine path in it."""

from __future__ import annotations

import re

from bench.app import REPO
from bench.report import relative, shown, write_report

MACHINE_PATH = re.compile(r"(?<![\w:/.~-])/(work|root|home|tmp|usr|opt|var|mnt)/")


def test_machine_paths_become_relative(tmp_path):
    out = tmp_path / "run"
    assert shown(REPO / "bench/results") == "bench/results" and shown(out) == "OUT"
    # under the results directory; under this checkout; under another checkout (the machine that ran it)
    assert relative(f"fastmode bench soak --json {out}/soak.json", out) == "fastmode bench soak --json OUT/soak.json"
    assert relative(f"--model {REPO}/models/full", out) == "--model models/full"
    assert relative("--out /elsewhere/x/bench/results", out) == "--out /elsewhere/x/bench/results"  # not a machine root
    assert relative("/srv/ci/fastmode/bench/results/turns.json", out) == "bench/results/turns.json"
    assert (relative("""--speculative-config '{"model": "/work/main/models/fast"}'""", out)
            == """--speculative-config '{"model": "models/fast"}'""")
    assert relative("/work/main/.venv/bin/python -m x", out) in ("python -m x", ".venv/bin/python -m x")
    assert relative("--out /tmp/q", out) == "--out q"  # any other machine path: its name
    # URLs and API routes are not machine paths
    for text in ("ws://127.0.0.1:25441/v1/responses", "GET /v1/door", "tok/s", "../bench/results/a.png"):
        assert relative(text, out) == text


def test_the_published_report_names_no_machine_path_issue_or_seeds(tmp_path):
    text = write_report(REPO / "bench/results", tmp_path / "benchmarks.md")
    assert "## 1. Lanes under load" in text and "## 8. Hostile input at every front door" in text
    # every stage's results are kept (a layout the model cannot split is named with its reason instead)
    assert "Not run." not in text and "Not run (" not in text
    assert not MACHINE_PATH.search(text), MACHINE_PATH.search(text)
    assert str(REPO) not in text and not re.search(r"\bissue \d+", text) and "seeds" not in text
    assert "Anthropic's fast mode" in text and "OpenAI's Codex-Spark" in text


def test_quality_v2_section_names_every_task_set_and_the_baseline(tmp_path):
    """Eval v2's results (``bench.quality --suite v2``, what the default pair runs) have their own
    section: pooled score, each task set's, the comparison with standard, the trivial baseline."""
    from bench.report import quality_section

    def scores(hits):  # (humaneval, next_line, tasks) hits out of (2, 3, 5)
        sets = {k: {"hits": h, "samples": n, "score": h / n} for k, h, n in zip(
            ("humaneval", "next_line", "tasks"), hits, (2, 3, 5), strict=True)}
        return sets, sum(hits)

    def lane(hits, served):
        sets, k = scores(hits)
        return {"exact_match_count": k, "tasks": sets, "per_user_tokens_per_s_p50": 20.0, "mean_latency_s": 0.5,
                "served_by": {served: 1.0}, "vs_standard": None if served == "standard" else {
                    "difference": -0.2, "difference_ci95": [-0.4, 0.0], "mcnemar_exact_p": 0.25}}

    base_sets, base_k = scores((0, 0, 1))
    doc = {"suite": "v2", "samples": 10, "counts": {"humaneval": 2, "next_line": 3, "tasks": 5},
           "lanes": {"standard": lane((1, 1, 3), "standard"), "fast": lane((0, 1, 2), "fast")},
           "baseline": {"name": "trivial baseline", "all": {"hits": base_k, "samples": 10}, "tasks": base_sets},
           "pareto_frontier": ["fast", "standard"], "fast_quality_retention": 0.6,
           "agreement_with_standard": {"fast vs standard": 0.3},
           "training_data": {"humaneval": "public since 2021"}}
    text = "\n".join(quality_section(doc, tmp_path, tmp_path / "benchmarks.md"))
    assert "2 HumanEval" in text and "3 next line" in text and "5 generated questions" in text
    assert "| standard | 50.0% [" in text and "(5) |" in text  # pooled: 5 of 10
    assert "| fast | 30.0% [" in text and "-20.0 pts [-40.0, +0.0], p=0.25" in text
    assert "| trivial baseline | 10.0% [" in text
    assert "keeps **60%**" in text and "public since 2021" in text


def test_the_header_names_each_sittings_speed_and_each_stages():
    """A run in sittings: the report says the machine's speed at each sitting's start and after
    each stage (``bench.machine_speed``), and which sitting ran each stage."""
    import json

    from bench.report import header

    suite = json.loads((REPO / "bench/results/suite.json").read_text())
    suite["sitting_speeds"] = [{"gb_per_s": 9.5}, {"gb_per_s": 9.1}]
    stages = list(suite["stages"])
    for k, name in enumerate(stages):
        suite["stages"][name].update(sitting=1 + (k >= 4), machine_gb_per_s_after=9.0 + k / 10)
    text = "\n".join(header(suite))
    assert "each stage but `quality` ran whole in one of them" in text
    assert "each sitting's start (`python -m bench.machine_speed`): 9.50 GB/s, 9.10 GB/s)" in text
    assert "| stage | command | seconds | result | sitting | machine GB/s after |" in text
    assert "| ok | 1 | 9.00 |" in text and f"| ok | 2 | {9.0 + (len(stages) - 1) / 10:.2f} |" in text
    published = "\n".join(header(json.loads((REPO / "bench/results/suite.json").read_text())))
    assert "machine GB/s" not in published and "each stage ran whole in one of them" in published
