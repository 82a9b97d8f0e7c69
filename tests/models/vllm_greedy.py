"""Run by tests in a subprocess: vLLM's greedy output for prompts, as JSON on stdout.

Usage: python -m tests.models.vllm_greedy CHECKPOINT MAX_TOKENS PROMPT_JSON
"""

import json
import sys


def main() -> None:
    from vllm import LLM, SamplingParams

    path, max_tokens, prompts = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    llm = LLM(model=path, dtype="float32", kv_cache_memory_bytes=64 * 2**20, gpu_memory_utilization=0.1,
              enforce_eager=True, seed=0)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    result = [{"prompt_token_ids": list(o.prompt_token_ids), "token_ids": list(o.outputs[0].token_ids)}
              for o in outs]
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
