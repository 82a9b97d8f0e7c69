"""``fastmode bench``: each subcommand runs its module's ``main`` with the rest of the command line."""

from __future__ import annotations

import importlib

import pytest

from bench import cli
from bench.suite import STAGES


def test_every_benchmark_is_a_module_with_a_main():
    for name, (module, help_) in cli.BENCHMARKS.items():
        assert callable(importlib.import_module(module).main) and help_, name
    # every stage of `fastmode bench all` is one of them (lanes-openai is `lanes --api openai`)
    assert {s for s in STAGES if s != "lanes-openai"} <= set(cli.BENCHMARKS)


def test_a_subcommand_gets_the_rest_of_the_line(monkeypatch):
    import bench.lanes

    seen = []
    monkeypatch.setattr(bench.lanes, "main", lambda argv: seen.append(argv) or 0)
    assert cli.main(["lanes", "--quick", "--levels", "1"]) == 0
    assert seen == [["--quick", "--levels", "1"]]


def test_fastmode_bench_is_this_dispatcher():
    from clients.cli import COMMANDS

    assert COMMANDS["bench"][0] == "bench.cli:main"


def test_an_unknown_benchmark_is_an_error(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["nope"])
    assert e.value.code == 2 and "invalid choice: 'nope'" in capsys.readouterr().err
    assert cli.main([]) == 2 and "BENCHMARK" in capsys.readouterr().out
