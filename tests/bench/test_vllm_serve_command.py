"""``bench.vllm_serve``'s server command: vLLM's server sized as fastmode's standard lane sizes its engine."""

from __future__ import annotations

import json

from bench import pair
from bench.vllm_serve import server_command
from serve.config import StandardLaneConfig
from serve.lanes.vllm_sizing import vllm_sizes


def test_vllm_server_gets_the_standard_lanes_context_and_kv_cache():
    cmd = server_command("full", 1234)
    want = vllm_sizes(json.loads((pair.full() / "config.json").read_text()), StandardLaneConfig())
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == str(want["kv_cache_memory_bytes"])
    assert cmd[cmd.index("--max-model-len") + 1] == str(want["max_model_len"])
    assert int(want["kv_cache_memory_bytes"]) > 0  # "auto" is fastmode's; vLLM's server takes bytes
