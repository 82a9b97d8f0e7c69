"""Ray Serve's own LLM stack (``ray.serve.llm.build_openai_app``) on a checkpoint, as a server to
benchmark against fastmode's lanes.

It is what a Ray user would deploy instead of fastmode's standard lane: Ray Serve LLM's OpenAI
ingress deployment in front of an ``LLMServer`` deployment running vLLM, with the same engine
settings as the standard lane (batch cap, dtype, KV-cache size, eager mode, seed), on a CPU
placement group. ``bench.vllm_serve`` starts it as a subprocess and drives it with the same load
generator and requests as vLLM's own server and fastmode's OpenAI API.

Usage (what ``bench.vllm_serve`` runs): python -m bench.ray_serve_llm --model PATH --served-model-name ID
                                                                    --port PORT
Serves until SIGINT or SIGTERM, then shuts Serve and Ray down.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from serve.config import StandardLaneConfig
from serve.lanes.vllm_sizing import vllm_sizes


def engine_kwargs(lane: StandardLaneConfig, checkpoint: str | Path) -> dict:
    """vLLM engine arguments equal to the lane's for ``checkpoint`` (``serve.lanes.vllm_engine``): its
    context and KV-cache bytes resolved as the lane resolves them (``vllm_sizes``; vLLM takes no ``auto``)."""
    sizes = vllm_sizes(json.loads((Path(checkpoint) / "config.json").read_text()), lane)
    return {"dtype": lane.dtype, "max_num_seqs": lane.max_num_seqs, **sizes,
            "gpu_memory_utilization": lane.gpu_memory_utilization, "enforce_eager": lane.enforce_eager,
            "seed": 0, **lane.engine_args}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ray_serve_llm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="checkpoint directory")
    ap.add_argument("--served-model-name", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args(argv)

    import ray
    from ray import serve
    from ray.serve.llm import LLMConfig, build_openai_app

    # Logical CPUs, as fastmode's launcher declares them: the ingress asks for one CPU and the
    # engine's placement group for another, on a 2-core host.
    # A Ray of its own ("local"), also where one is already running (the app of ``bench all --url``).
    ray.init(address="local", num_cpus=16, include_dashboard=False)
    serve.start(http_options={"host": args.host, "port": args.port})
    config = LLMConfig(
        model_loading_config={"model_id": args.served_model_name, "model_source": args.model},
        placement_group_config={"bundles": [{"CPU": 1}]},  # a CPU engine: no GPU bundle
        deployment_config={"autoscaling_config": {"min_replicas": 1, "max_replicas": 1}},
        engine_kwargs={k: v for k, v in engine_kwargs(StandardLaneConfig(), args.model).items() if v is not None},
    )
    serve.run(build_openai_app({"llm_configs": [config]}), blocking=False)
    print(f"ray serve llm ready on http://{args.host}:{args.port}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
