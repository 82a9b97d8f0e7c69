"""``fastmode cluster``: the exact ``ray`` commands each action issues (a fake runner; no cluster)."""

from __future__ import annotations

import pytest
import yaml

from clients import cli as fastmode_cli
from cluster import cli
from cluster.cli import RAY
from cluster.render import DASHBOARD, REMOTE_SERVE_CONFIG
from cluster.topology import REPO_ROOT

LOCAL = str(REPO_ROOT / "cluster" / "examples" / "local-2node.yaml")


class FakeRunner:
    def __init__(self, fail_at: int | None = None) -> None:
        self.calls: list[tuple[list[str], bool]] = []
        self.fail_at = fail_at

    def __call__(self, cmd: list[str], *, quiet: bool = False) -> int:
        self.calls.append((cmd, quiet))
        return 3 if len(self.calls) == self.fail_at else 0

    @property
    def commands(self) -> list[list[str]]:
        return [cmd for cmd, _ in self.calls]


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A HOME that already has a Ray token."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".ray").mkdir(parents=True)
    (tmp_path / "home" / ".ray" / "auth_token").write_text("x")
    return tmp_path / "home"


def run(argv: list[str], runner: FakeRunner | None = None) -> tuple[int, FakeRunner]:
    runner = runner or FakeRunner()
    return cli.main(argv, runner=runner), runner


def test_render_writes_both_files_and_runs_nothing(tmp_path, capsys):
    rc, runner = run(["render", LOCAL, "--out", str(tmp_path)])
    assert rc == 0 and runner.calls == []
    out = capsys.readouterr().out
    for name in ("ray-cluster.yaml", "serve-config.yaml"):
        assert str(tmp_path / name) in out
        assert yaml.safe_load((tmp_path / name).read_text())


def test_default_out_dir_is_named_after_the_cluster(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run(["render", LOCAL])[0] == 0
    assert (tmp_path / ".fastmode" / "cluster" / "fastmode-local" / "ray-cluster.yaml").is_file()


def test_up_starts_the_cluster_then_deploys(tmp_path, home):
    rc, runner = run(["up", LOCAL, "--out", str(tmp_path)])
    cluster, serve = str(tmp_path / "ray-cluster.yaml"), str(tmp_path / "serve-config.yaml")
    assert rc == 0
    assert runner.calls == [
        ([RAY, "up", "-y", cluster], False),
        ([RAY, "rsync-up", cluster, serve, REMOTE_SERVE_CONFIG], False),
        ([RAY, "exec", cluster, f"serve deploy --address {DASHBOARD} {REMOTE_SERVE_CONFIG}"], False),
    ]


def test_up_makes_a_ray_token_first_when_there_is_none(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "empty-home"))
    rc, runner = run(["up", LOCAL, "--out", str(tmp_path)])
    assert rc == 0
    # quiet: `ray get-auth-token --generate` prints the token, which must not reach the terminal.
    assert runner.calls[0] == ([RAY, "get-auth-token", "--generate"], True)
    assert runner.commands[1] == [RAY, "up", "-y", str(tmp_path / "ray-cluster.yaml")]


def test_down(tmp_path, home):
    rc, runner = run(["down", LOCAL, "--out", str(tmp_path)])
    assert rc == 0 and runner.commands == [[RAY, "down", "-y", str(tmp_path / "ray-cluster.yaml")]]


def test_serve_cli_reaches_the_dashboard_on_loopback():
    assert DASHBOARD == "http://127.0.0.1:8265"


def test_status(tmp_path, home):
    rc, runner = run(["status", LOCAL, "--out", str(tmp_path)])
    assert rc == 0
    assert runner.commands == [[RAY, "exec", str(tmp_path / "ray-cluster.yaml"),
                                "ray status && serve status --address http://127.0.0.1:8265"]]


def test_deploy_only_updates_the_application(tmp_path, home):
    rc, runner = run(["deploy", LOCAL, "--out", str(tmp_path)])
    assert rc == 0 and [c[1] for c in runner.commands] == ["rsync-up", "exec"]


def test_a_failing_step_stops_the_rest(tmp_path, home, capsys):
    rc, runner = run(["up", LOCAL, "--out", str(tmp_path)], FakeRunner(fail_at=1))
    assert rc == 3 and len(runner.calls) == 1
    assert f"`{RAY} up -y {tmp_path / 'ray-cluster.yaml'}` failed (exit 3)" in capsys.readouterr().err


def test_bad_topology_exits_2_before_running_anything(tmp_path, capsys):
    bad = tmp_path / "t.yaml"
    data = yaml.safe_load(open(LOCAL))
    data["lanes"]["fast"]["node_type"] = "gpu"
    bad.write_text(yaml.safe_dump(data))
    rc, runner = run(["up", str(bad), "--out", str(tmp_path / "out")])
    assert rc == 2 and runner.calls == []
    assert "lanes.fast.node_type: no node type 'gpu'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_registered_as_a_fastmode_command(tmp_path, capsys):
    assert fastmode_cli.COMMANDS["cluster"][0] == "cluster.cli:main"
    assert fastmode_cli.main(["cluster", "render", LOCAL, "--out", str(tmp_path)]) == 0
    assert (tmp_path / "serve-config.yaml").is_file()
