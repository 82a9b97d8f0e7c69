"""Multi-node on one machine: the fast model's pipeline stages on two Ray nodes, tokens as on one.

A ``ray.cluster_utils.Cluster`` of three nodes on this machine, each its own raylet: the head (no
chips; the driver connects to it) and two workers with one ``chip`` each, told apart by a
resource of their own (``node_a``, ``node_b``). A ``tp=1 x pp=2`` layout needs one chip per
stage, so ``reserve_stages`` can only put stage 0 and stage 1 on different nodes; the tests check
that it did (from inside the actors and from the placement groups), that the stage 0 -> stage 1
hop is recorded between them, and that greedy and seeded tokens equal those of the single-node
in-process engine and of transformers, over the ring's TCP links.

Token authentication stays on (``RAY_AUTH_MODE=token``, as a local ``ray.init`` does by
default). The module shuts down whatever Ray this process had before it starts its cluster, and
shuts the cluster down afterwards, checking that none of its processes (raylets, GCS, the chip
actors' workers) is left behind.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import ray
import torch

from models import TEST_FAST
from sharding.pipeline import ShardedModel
from sharding.sampling import SamplingParams
from tests.conftest import shipped

pytestmark = pytest.mark.slow

NODES = ("node_a", "node_b")
"""The worker nodes' own resources (one chip each); the head has none."""
PROMPTS = ["def fibonacci(n):\n", "import os\n\n\ndef list_files(path):\n",
           "class Stack:\n    def push(self, item):\n"]
NEW_TOKENS = 24
MAX_LEN = 128
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS)
SEEDED = SamplingParams(temperature=0.8, top_p=0.95, seed=11, max_tokens=NEW_TOKENS)


def _alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` still running (a zombie, exited but not yet reaped, counts as gone)."""
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def _address_file_keeper():
    """A function that puts the Ray address file back as it is now (present with its text, or absent)."""
    from ray._private.utils import get_ray_address_file

    file = Path(get_ray_address_file(None))
    before = file.read_text() if file.exists() else None

    def restore() -> None:
        if before is None:
            file.unlink(missing_ok=True)
        else:
            file.write_text(before)

    return restore


def _start_cluster(restore_address, attempts: int = 2):
    """The head and the two chip nodes, all registered; retried once from scratch, because on a
    starved machine a raylet can give up waiting for its (Python) agents to start and exit."""
    from ray.cluster_utils import Cluster

    for attempt in range(attempts):
        c = Cluster(initialize_head=False)
        try:
            c.add_node(num_cpus=1, resources={"head": 1}, include_dashboard=False)
            restore_address()
            for name in NODES:
                c.add_node(num_cpus=1, resources={"chip": 1, name: 1})
            c.wait_for_nodes()
            return c
        except Exception:
            c.shutdown()
            restore_address()
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def path() -> Path:
    return shipped(TEST_FAST)


@pytest.fixture(scope="module")
def cluster():
    """A head (no chips) and two one-chip worker nodes; the driver is connected to the head."""
    from ray._private.authentication.authentication_token_generator import generate_new_authentication_token
    from ray._raylet import AuthenticationTokenLoader, Config

    def reload_auth() -> None:  # this process caches the mode and the token: re-read the environment
        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()

    if ray.is_initialized():  # another module's session: this one needs its own cluster
        ray.shutdown()
    try:
        with pytest.MonkeyPatch.context() as mp:
            # Token authentication on, as a local ray.init() has it by default, with a token of
            # this cluster's own (not ~/.ray/auth_token, which another Ray user on the machine may
            # rewrite while the nodes start); the nodes inherit both from the environment.
            mp.setenv("RAY_AUTH_MODE", "token")
            mp.setenv("RAY_AUTH_TOKEN", generate_new_authentication_token())
            reload_auth()
            # The head writes its address where a plain ray.init() on this machine looks for a
            # cluster to join (/tmp/ray/ray_current_cluster), and Cluster.shutdown deletes it: put
            # back what was there both times, so no other Ray user here joins or loses a cluster.
            restore_address = _address_file_keeper()
            c = _start_cluster(restore_address)
            c.actor_pids = set()  # the chip actors' worker processes, added by the tests
            pids = {p.process.pid for node in c.list_all_nodes() for infos in node.all_processes.values()
                    for p in infos}
            try:
                ray.init(address=c.address, log_to_driver=False)
                yield c
            finally:
                ray.shutdown()
                c.shutdown()
                restore_address()
    finally:
        reload_auth()  # back to this process's own mode and token
    assert pids, "no node processes recorded to check"
    pids |= c.actor_pids
    deadline = time.monotonic() + 20
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(pids), f"Ray processes left behind: {sorted(_alive(pids))}"


@pytest.fixture(scope="module")
def prompts(path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    return [[tok.bos_token_id, *tok(p, add_special_tokens=False).input_ids] for p in PROMPTS]


@pytest.fixture(scope="module")
def single_node(path, prompts) -> dict[str, list[list[int]]]:
    """The in-process engine's tokens (tp=1 x pp=1, no Ray): greedy each alone, greedy batched, seeded."""
    from sharding.engine import Engine

    engine = Engine.from_pretrained(path, num_slots=4, max_len=MAX_LEN)
    return {"alone": [engine.generate([p], GREEDY)[0] for p in prompts],
            "batched": engine.generate(prompts, GREEDY),
            "seeded": engine.generate(prompts, SEEDED)}


def _whereabouts(actor) -> tuple[str, int]:
    """``(node id, pid)`` of an actor, asked from inside it."""
    ask = actor.__ray_call__.remote(lambda self: (ray.get_runtime_context().get_node_id(), os.getpid()))
    return ray.get(ask, timeout=30)


@pytest.fixture(scope="module")
def pipe(cluster, path):
    """``(model, {chip id: node id})``: the fast model, tp=1 x pp=2, over the cluster's two chips."""
    model = ShardedModel.from_pretrained(path, tp=1, pp=2, num_slots=4, max_len=MAX_LEN, placement_timeout_s=30)
    try:
        actors = model._workers
        where = [_whereabouts(a) for a in actors]
        cluster.actor_pids |= {pid for _, pid in where}
        nodes = {c.chip: node for c, (node, _) in zip(model.layout, where, strict=True)}
        yield model, nodes
    finally:
        model.shutdown()


def _node_ids_by_resource() -> dict[str, str]:
    return {name: n["NodeID"] for n in ray.nodes() if n["Alive"] for name in (*NODES, "head")
            if name in n["Resources"]}


def test_cluster_has_three_nodes_and_two_chips(cluster):
    assert len([n for n in ray.nodes() if n["Alive"]]) == 3
    assert ray.cluster_resources().get("chip") == 2
    assert ray.get_runtime_context().get_node_id() == _node_ids_by_resource()["head"]


def test_the_cluster_refuses_callers_without_its_token(cluster):
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    with grpc.insecure_channel(cluster.address) as channel:
        ask = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId
        for token in (None, "0" * 64):
            with pytest.raises(grpc.RpcError) as refused:
                ask(gcs_service_pb2.GetClusterIdRequest(), timeout=10,
                    metadata=[("authorization", f"Bearer {token}")] if token else None)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        ask(gcs_service_pb2.GetClusterIdRequest(), timeout=10,
            metadata=[("authorization", f"Bearer {os.environ['RAY_AUTH_TOKEN']}")])


def test_stages_run_on_different_nodes(pipe):
    model, nodes = pipe
    by_resource = _node_ids_by_resource()
    stage_nodes = [nodes[c.chip] for c in model.layout]
    assert [(c.stage, c.layers) for c in model.layout] == [(0, (0, 2)), (1, (2, 4))]
    assert sorted(stage_nodes) == sorted(by_resource[n] for n in NODES)  # one per worker node
    assert by_resource["head"] not in stage_nodes  # the driver's node has no chip
    # The placement groups agree: each stage's bundle is on its actor's node.
    groups = [ray.util.placement_group_table(pg)["bundles_to_node_id"][0] for pg in model._groups]
    assert groups == stage_nodes


def test_single_node_run_is_transformers_greedy(path, prompts, single_node):
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert single_node["batched"] == single_node["alone"] and all(single_node["alone"])
    with torch.no_grad():
        for p, got in zip(prompts, single_node["alone"], strict=True):
            out = hf.generate(torch.tensor([p]), do_sample=False, max_new_tokens=NEW_TOKENS,
                              pad_token_id=hf.config.pad_token_id)
            assert out[0, len(p):].tolist() == got


def test_greedy_tokens_match_single_node(pipe, prompts, single_node):
    model, _ = pipe
    assert [model.generate([p], GREEDY)[0] for p in prompts] == single_node["alone"]
    assert model.generate(prompts, GREEDY) == single_node["batched"]


def test_seeded_samples_match_single_node(pipe, prompts, single_node):
    model, _ = pipe
    assert model.generate(prompts, SEEDED) == single_node["seeded"]


def test_hop_between_stages_crosses_nodes(pipe, prompts):
    model, nodes = pipe
    d = model.config.hidden_size
    model.add("x", prompts[0], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    infos = []
    while model.has_work:
        model.step()
        infos += model.last_infos
    assert len(infos) == 3
    for i, info in enumerate(infos):
        hops = info.hops
        assert {(h.src_stage, h.dst_stage) for h in hops} == {(0, 1), (1, 0)}  # the ring: there and back
        (between,) = [h for h in hops if (h.src_stage, h.dst_stage) == (0, 1)]
        assert (between.src_chip, between.dst_chip) == (model.layout[0].chip, model.layout[1].chip)
        assert nodes[between.src_chip] != nodes[between.dst_chip]
        rows = len(prompts[0]) if i == 0 else 1  # the prefill, then one decode row
        assert between.bytes == rows * d * 4 and between.seconds > 0 and between.transport == "tcp"
