"""Run by tests in a subprocess: vLLM's greedy output for prompts on each checkpoint, as JSON on stdout.

Usage: python -m tests.models.vllm_greedy MAX_TOKENS PROMPT_JSON CHECKPOINT [CHECKPOINT ...]

The checkpoints load one after the other in this one process, each engine in process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set by the caller): one vLLM import and no engine-core
process per checkpoint, which saves CI about 40 s a checkpoint on a 2-core machine.
"""

import gc
import json
import sys
from pathlib import Path


def main() -> None:
    from vllm import LLM, SamplingParams

    max_tokens, prompts, paths = int(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3:]
    result = {}
    for path in paths:
        # A context the 64 MiB cache holds whole (vLLM refuses a cache shorter than one sequence): a real
        # model's own (8,192 positions of SmolLM2's 30 layers) would not fit.
        context = min(json.loads(Path(path, "config.json").read_text())["max_position_embeddings"], 1024)
        llm = LLM(model=path, dtype="float32", kv_cache_memory_bytes=64 * 2**20, gpu_memory_utilization=0.1,
                  enforce_eager=True, seed=0, max_model_len=context)
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
        result[path] = [{"prompt_token_ids": list(o.prompt_token_ids), "token_ids": list(o.outputs[0].token_ids)}
                        for o in outs]
        del llm, outs
        gc.collect()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
