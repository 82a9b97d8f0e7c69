"""The v2 eval's sandbox and HumanEval's checker: HumanEval's own canonical solutions (written by
its authors, not here) pass; wrong, endless, memory-hungry and destructive programs do not."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.eval import humaneval, sandbox


@pytest.fixture(scope="module")
def problems() -> list[humaneval.Problem]:
    return humaneval.problems()


def test_every_canonical_solution_passes(problems):
    assert len(problems) == 164 and problems[0].task_id == "HumanEval/0" and problems[-1].task_id == "HumanEval/163"
    outcomes = humaneval.check_all([(p, p.canonical_solution) for p in problems])
    failed = [(p.task_id, o.status, o.stderr_tail[-200:]) for p, o in zip(problems, outcomes) if not o.passed]
    assert failed == []


def test_a_wrong_solution_and_the_baseline_fail(problems):
    p = problems[0]  # has_close_elements: its tests expect both True and False
    wrong = humaneval.check(p, "    return False\n")
    assert wrong.status == sandbox.FAILED and "AssertionError" in wrong.stderr_tail
    assert humaneval.check(p, humaneval.BASELINE).status == sandbox.FAILED


def test_an_endless_loop_is_stopped_at_the_time_limit(problems):
    out = humaneval.check(problems[0], "    while True:\n        pass\n", timeout_s=1.0)
    assert out.status == sandbox.TIMEOUT and out.seconds < 5


def test_a_memory_hog_is_stopped_at_the_memory_limit(problems):
    out = humaneval.check(problems[0], "    x = bytearray(1 << 30)\n    return True\n", memory_bytes=256 << 20)
    assert out.status == sandbox.MEMORY and "MemoryError" in out.stderr_tail
    assert sandbox.run("x = bytearray(64 << 20)\n", memory_bytes=256 << 20).passed  # under the limit: runs


def test_files_processes_and_sockets_are_refused(tmp_path: Path):
    keep = tmp_path / "keep.txt"
    keep.write_text("x")
    for source in (f"import os\nos.remove({str(keep)!r})\n", "import shutil\nshutil.rmtree('/tmp')\n",
                   "import subprocess\nsubprocess.run(['true'])\n", "import os\nos.system('true')\n",
                   "import socket\nsocket.socket()\n"):
        out = sandbox.run(source)
        assert out.status == sandbox.FAILED and "PermissionError" in out.stderr_tail, source
    assert keep.exists()


def test_the_program_runs_in_a_temp_directory_with_an_empty_environment():
    out = sandbox.run("import os, sys\nassert os.getcwd().startswith('/tmp') or 'fastmode-eval-' in os.getcwd()\n"
                      "assert 'fastmode-eval-' in os.getcwd()\nassert not any(k.startswith('PYTHON') for k in os.environ)\n"
                      "assert sys.flags.isolated\n")
    assert out.passed, out.stderr_tail


def test_limits_must_be_positive():
    with pytest.raises(sandbox.SandboxError):
        sandbox.run("pass", timeout_s=0)


def test_truncate_at_the_first_stop():
    assert humaneval.truncate("    return 1\n\ndef other():\n    pass") == "    return 1\n"
    assert humaneval.truncate("    return 1\n\n\nprint(f(2))") == "    return 1\n\n"
    assert humaneval.truncate("    return 1\n") == "    return 1\n"
