"""The deployment config: one YAML file (or dict) describes the whole application.

Every field has a default that serves the shipped models on a CPU-only machine, so an empty file
(or no file) is a working deployment. ``load_config`` validates and raises ``ConfigError`` naming
the offending field. ``serve/fastmode.yaml`` is the default written out, with comments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from sharding import cpus as _cpus
from models import DEFAULT_FAST, FULL_BUILTIN

from .errors import ConfigError, validate_mapping


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Strict):
    """A checkpoint and the id clients ask for it by."""

    id: str = Field(min_length=1, description="Model id in requests and /v1/models.")
    path: str = Field(min_length=1, description="Hugging Face-format checkpoint directory (config.json, "
                      "safetensors, tokenizer.json), readable at this path on every node; or a GGUF file "
                      "(converted once into a cached checkpoint, models/gguf.py); or builtin:NAME, a model "
                      "shipped in a Python package (builtin:smollm2-135m-instruct); or, for the fast model, a "
                      "student folder written by fastmode distill (assembled with the full model it was "
                      "distilled from). A relative path is relative to the config file.")
    chat_template: str | None = Field(default=None, description="A Jinja chat template to render this model's "
                                      "chat messages with instead of the checkpoint's own (vLLM's --chat-template): "
                                      "the template, or the path of a file holding it (relative to the config "
                                      "file). Default: the checkpoint's (chat_template.jinja or "
                                      "tokenizer_config.json); a model with none joins messages one per line.")
    chat_template_kwargs: dict[str, Any] | None = Field(default=None, description="Variables every rendering "
                                                        "of the chat template gets (vLLM's "
                                                        "--default-chat-template-kwargs); a request's own "
                                                        "chat_template_kwargs win.")


class ModelsConfig(_Strict):
    full: ModelSpec = Field(default=ModelSpec(id="fastmode-full", path=FULL_BUILTIN),
                            description="The full model, served by the priority, standard and exact lanes "
                            "(default: SmolLM2-135M-Instruct, docs/models.md).")
    fast: ModelSpec = Field(default=ModelSpec(id="fastmode-fast", path=str(DEFAULT_FAST)),
                            description="The small model, served by the fast lane (and the exact lane's "
                            "drafter: it must share the full model's tokenizer; default: the student "
                            "distilled from the default full model, models/fast).")

    @model_validator(mode="after")
    def _distinct_ids(self) -> ModelsConfig:
        if self.full.id == self.fast.id:
            raise ValueError(f"the full and fast models need different ids, both are {self.full.id!r}")
        if "auto" in (self.full.id, self.fast.id):
            raise ValueError("'auto' is the router's model id; name the models otherwise")
        return self


class LaneCommon(_Strict):
    price: float = Field(default=1.0, ge=0, description="Cost multiplier: a response costs "
                         "price x (input + output tokens) / 1000 cost units.")
    stream_interval_ms: float = Field(default=50.0, ge=0, le=1000, description="The longest coalescing window: "
                                      "tokens produced within the window after the previous chunk travel as "
                                      "one chunk. The window adapts (5 ms up to this) so that a chunk costs "
                                      "at most 2% of the stream (Ray Serve has a fixed cost per streamed item). "
                                      "The first token and a response's end are never held.")
    replicas: int = Field(default=1, ge=1, description="Serve replicas of this lane (each its own engine).")
    max_constructor_retry_count: int | None = Field(default=None, ge=1, description="How many failed starts "
        "of this lane's replicas Serve allows before the deployment fails and fastmode up exits naming the "
        "cause (Ray Serve's own option; Serve caps it at 3 per replica). Default: Serve's, 3 per replica. "
        "1 fails at the first failed start, for configs known not to be flaky.")
    ray_actor_options: dict[str, Any] = Field(default_factory=lambda: {"num_cpus": 0}, description=
                                              "Ray options of each replica, e.g. {num_gpus: 1} on a GPU node.")


def _layout_size(value: Any) -> int | str:
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError("must be a positive integer or 'auto'")


LayoutSize = Annotated[int | Literal["auto"], BeforeValidator(_layout_size)]
"""``tp``/``pp``: a chip count, or ``"auto"`` (the planner's pick)."""


PackedWeights = bool | Literal["auto"]
"""``packed_weights``: read decode steps' weights as bfloat16 (``sharding.packed``), or ``"auto"``."""

_PACKED = ("Decode steps read the weights as bfloat16 and compute in float32 (sharding/packed.py, an AVX2 "
           "kernel built on first use): half the bytes a step streams, the same tokens for bfloat16 "
           "checkpoints such as the shipped ones (weights that are not bfloat16 values stay float32). "
           "'auto': on where it runs (float32 on an x86-64 CPU with AVX2, a C++ compiler, ninja), else off; "
           "true: fail at start where it cannot run.")


class FastLaneConfig(LaneCommon):
    """The fast lane: the small model on fastmode's own sharded executor."""

    tp: LayoutSize = Field(default="auto", description="Tensor-parallel "
        "chips per pipeline stage; 'auto': the planner's pick (fastmode plan) for the model on the chips the "
        "cluster offers (Ray resource 'chip', divided among the lane's replicas).")
    pp: LayoutSize = Field(default="auto", description="Pipeline stages, "
        "each on its own chips (pp=2 puts a chip-to-chip hop in every step, even on one machine); 'auto': "
        "the planner's pick (fastmode plan says which and why; fastmode bench sharding compares layouts).")
    num_slots: int = Field(default=8, ge=1, description="Sequences decoded at once (KV-cache slots); "
                           "more requests wait in FIFO order.")
    max_len: int | None = Field(default=None, ge=1, description="Tokens per sequence; default: the "
                                "model's context, at most 4096 and at most what kv_cache_bytes holds.")
    kv_cache_bytes: int | None = Field(default=None, ge=1, description="KV cache per chip; null: 1 GiB "
                                       "(sharding.kv_cache.DEFAULT_KV_CACHE_BYTES). A max_len over it is refused.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(default="float32", description=
                                                             "Weights and activations.")
    transport: Literal["tcp"] = Field(default="tcp", description="How the chips of the ring pass each "
        "step on: TCP links (sharding/transport.py), the same on one machine and across nodes. docs/sharding.md "
        "compares it with Ray actor calls and compiled graphs; fastmode bench sharding times a hop.")
    device: Literal["cpu", "cuda"] = Field(default="cpu", description="Where each chip computes.")
    compile: bool = Field(default=True, description="torch.compile each chip's step (warmed up at "
                          "start, over every shape the lane meets, so no request waits for a compile).")
    threads_per_chip: int = Field(default=1, ge=1, description="torch threads per chip: the cores each "
                                  "chip owns (1 where a chip is a CPU core).")
    prefix_cache: bool = Field(default=True, description="Keep a finished sequence's KV-cache slot for a "
        "later prompt that starts with its tokens (a conversation's next turn prefills only the new part; "
        "sharding/prefix_cache.py). Parked slots are given up, oldest first, when a new request needs one.")
    spin_us: float = Field(default=2000.0, ge=0, le=100000, description="A chip polls its link this long "
        "before sleeping, and the head its clients' links this long after its last step: waking a sleeping "
        "core costs more than a hop, and a step after a sleep runs colder (bench/ttft_idle.py). An idle "
        "lane sleeps.")
    packed_weights: PackedWeights = Field(default="auto", description=_PACKED + " Each chip decides for "
                                          "its own CPU.")
    door: bool | None = Field(default=None, description="The head chip serves the fast lane's own "
        "WebSocket in its loop (serve/lanes/door.py): the gateway's protocol for this model, without the "
        "gateway's process on a first token's way (docs/front-doors.md). Bound to http.host, with the gateway's keys "
        "and limits; GET /v1/door gives its URL. null: on unless http has TLS (the door has none); true with "
        "TLS is refused.")
    door_port: int = Field(default=0, ge=0, le=65535, description="The door's port (0: any free one, "
                           "which changes when the ring is rebuilt; GET /v1/door says which).")
    vocab: Annotated[int, Field(ge=16)] | Literal["auto"] | None = Field(default="auto", description="The "
        "fast model produces only this many of its tokens, the most frequent in the full model's answers (the "
        "fast model folder's token_counts.json, which fastmode distill writes) and its end-of-turn ids: its "
        "head keeps their rows alone, so a step multiplies by that many rows instead of the whole "
        "vocabulary's (SmolLM2's head is half the shipped student's weights). Every other token's logit is "
        "-inf (but for the request's own prompt tokens, vocab_keeps_prompt): the lane's output is cut, as its "
        "quality eval measures (sharding/draft_vocab.py). 'auto': "
        "4096 where the fast model has token counts and a vocabulary of at least 8192, else the whole "
        "vocabulary (how the default was measured: docs/decisions/); null: the whole vocabulary. Needs tp 1 "
        "('auto' keeps the whole vocabulary at tp > 1).")
    vocab_keeps_prompt: bool = Field(default=True, description="With a cut vocab, each request may also "
        "produce the tokens of its own prompt (the names, numbers and identifiers an answer copies out of its "
        "question are rarely among the most frequent): their rows of the whole head are gathered at "
        "admission and multiplied for that request alone, so its output never depends on what else is "
        "batched (sharding/draft_vocab.py PromptRows; docs/decisions/033). false: the kept ids alone.")


class VLLMLaneConfig(LaneCommon):
    """A full-model lane on vLLM (AsyncLLM); priority and standard differ only by these values."""

    max_num_seqs: int = Field(ge=1, description="vLLM's batch cap: sequences decoded at once per replica.")
    max_model_len: int | None = Field(default=None, ge=1, description="Context per sequence; default: "
                                      "the model's, at most 4096 (sharding.kv_cache.DEFAULT_MAX_LEN).")
    dtype: str = Field(default="float32", description="vLLM dtype (float32 on CPU, bfloat16 on GPU; 'auto': "
                       "the checkpoint's).")
    kv_cache_memory_bytes: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field(default="auto", description="KV-cache size "
        "per replica. 'auto': room for max_num_seqs sequences of max_model_len tokens, at most 1 GiB but never "
        "less than one whole sequence (serve/lanes/vllm_sizing.py); null lets vLLM size it from "
        "gpu_memory_utilization (GPUs).")
    gpu_memory_utilization: float = Field(default=0.1, gt=0, le=1, description="vLLM's memory share.")
    enforce_eager: bool = Field(default=True, description="Skip CUDA graphs / compilation (fast start).")
    block_size: int | None = Field(default=32, ge=1, description="vLLM's KV-cache block: its prefix cache "
        "reuses whole blocks, so a conversation's next turn re-prefills up to block_size - 1 history tokens "
        "(unless it continues its session: sessions). "
        "32 (vLLM's CPU default is 128): a long conversation's turns re-prefill less of their history, and "
        "decode is not slower (docs/multi-turn.md; fastmode bench turns measures it); null: vLLM's default. "
        "vLLM's CPU attention takes multiples of 32 only (16 is refused when the engine starts).")
    executor: Literal["auto", "uni", "mp"] = Field(default="auto", description="Where vLLM runs the model: "
        "'uni' in its engine-core process, beside the scheduler; 'mp' in a worker process of its own, which the "
        "scheduler polls over shared memory (vLLM's choice on CPU, where it forces 'mp'). 'auto': 'uni' on one "
        "chip (tensor and pipeline parallel 1 in engine_args), else vLLM's default: 'uni' spares every step "
        "the hand-off to another process, so it decodes faster and with less CPU per token (docs/lanes.md; "
        "the measurement: docs/decisions/).")
    sessions: bool = Field(default=True, description="Keep a conversation's sequence in vLLM between its "
        "turns (vLLM's streaming input, serve/lanes/vllm_sessions.py): the next turn appends its new tokens "
        "and reuses every computed one, where the prefix cache reuses whole blocks only. A parked session "
        "holds one of max_num_seqs's slots until a request needs it or session_idle_s passes. Requests with "
        "stop strings, or sampled with a seed, run as plain requests. Not on the exact lane's vLLM engine.")
    session_idle_s: float = Field(default=10.0, gt=0, description="Longest a session stays parked between turns.")
    engine_args: dict[str, Any] = Field(default_factory=dict, description="Further vLLM AsyncEngineArgs.")
    admission: Literal["reject", "queue"] = Field(default="queue", description="When every replica "
        "holds max_num_seqs streams: 'reject' answers 'overloaded' at once (or spills to standard if "
        "the request allows), 'queue' lets requests wait in vLLM's queue.")
    retry_after_s: float = Field(default=1.0, ge=0, description="The retry hint of an overloaded rejection.")


class PriorityLaneConfig(VLLMLaneConfig):
    """The priority lane: a low batch cap (fast per user), rejecting when full, 6x the price."""

    max_num_seqs: int = Field(default=2, ge=1, description="vLLM's batch cap per replica.")
    admission: Literal["reject", "queue"] = Field(default="reject", description="See VLLMLaneConfig.")
    price: float = Field(default=6.0, ge=0, description="Cost multiplier: 6x, the price of Anthropic's "
                         "published fast mode (2.5x the speed at 6x the price).")


class StandardLaneConfig(VLLMLaneConfig):
    """The standard lane: a high batch cap (cheapest per token), queueing when full."""

    max_num_seqs: int = Field(default=32, ge=1, description="vLLM's batch cap per replica.")


class ExactLaneConfig(VLLMLaneConfig):
    """The exact lane: the full model's exact output, decoded faster by speculative decoding: the
    fast model drafts ``num_speculative_tokens`` tokens, the full model verifies them all in one
    forward pass and keeps the longest prefix it agrees with (greedy: token for token the full
    model's greedy output; sampled: the rejection rule keeps the full model's distribution).

    ``engine`` picks who runs it (``fastmode bench speculative`` compares them; docs/lanes.md):
    fastmode's own executor (``sharding/speculative.py``, in the lane replica's process) or vLLM's
    ``draft_model`` speculative decoding (the vLLM fields below apply to it only). Sampled requests
    for the exact tier run on the priority lane when the engine is vLLM: its speculative sampling
    does not keep the full model's distribution on vLLM's CPU build (docs/lanes.md)."""

    engine: Literal["fastmode", "vllm"] = Field(default="fastmode", description="'fastmode': both models "
        "on fastmode's executor in the replica (torch.compile, a prefix cache, one engine thread on the "
        "compute cores); 'vllm': vLLM's speculative decoding (method draft_model). fastmode's keeps the full "
        "model's distribution when sampling; where each is faster: docs/lanes.md, the measurement that "
        "chose the default: docs/decisions/.")
    max_num_seqs: int = Field(default=2, ge=1, description="The batch cap per replica (low, as "
                              "priority's: speculative decoding pays where a step is not already full).")
    admission: Literal["reject", "queue"] = Field(default="reject", description="See VLLMLaneConfig.")
    price: float = Field(default=6.0, ge=0, description="Cost multiplier: the priority lane's, whose batch "
                         "cap it shares.")
    sessions: Literal[False] = Field(default=False, description="Not on this lane: vLLM's streaming input is "
        "not tested with its speculative decoding; fastmode's engine keeps its own prefix cache (prefix_cache).")
    num_speculative_tokens: int = Field(default=3, ge=1, le=16, description="Tokens the fast model drafts "
        "per verify step (k; at most 8 on fastmode's engine; with adaptive_k the most it drafts). The default is fastmode bench speculative's "
        "pick on both engines (docs/decisions/); rerun it on your hardware.")
    num_speculative_tokens_per_batch_size: list[tuple[int, int, int]] | None = Field(default=None,
        description="vLLM's batch-size schedule of k: [[from, to, k], ...] (inclusive batch-size ranges), "
        "e.g. fewer drafts when a larger batch already fills each step. engine: vllm only.")
    adaptive_k: bool = Field(default=True, description="fastmode's engine: choose k each round, from 0 (a "
        "plain decode step of the full model, where drafts are accepted too rarely to pay) to "
        "num_speculative_tokens, from the acceptance and step times measured so far "
        "(sharding.speculative.best_k). false: always num_speculative_tokens drafts. How the default was "
        "measured: docs/decisions/.")
    compile: bool = Field(default=True, description="fastmode's engine: torch.compile both models, warmed "
                          "up over every shape the lane meets (see compile_in_background).")
    compile_regions: bool = Field(default=True, description="fastmode's engine, with compile: each model "
        "compiles one decoder layer and reuses it for every layer (torch.compiler.nested_compile_region), so "
        "the warm-up does not grow with the model's depth, and each step runs on inductor's Python launcher, "
        "one call per layer (somewhat slower). false: one graph per model and step shape, with the C++ "
        "launcher. "
        "docs/decisions/035-the-exact-lane-compiles-one-layer.md.")
    compile_in_background: bool = Field(default=True, description="fastmode's engine, with compile: the lane "
        "starts on eager models and switches to the compiled ones once their compile and warm-up, in a "
        "thread of the replica on the serving cores, have finished (requests running then end on the "
        "eager models; the same tokens either way; until then the replica holds both engines' weights and "
        "caches). /health's lanes.exact.compile says which models serve. false: the lane starts only once "
        "compiled (a cold compile takes minutes on a small CPU).")
    threads: int = Field(default=1, ge=1, description="fastmode's engine: torch threads of the engine "
                         "thread (the compute cores it may use).")
    prefix_cache: bool = Field(default=True, description="fastmode's engine: keep a finished sequence's "
        "slot for a later prompt that continues it (sharding/prefix_cache.py), in both models' caches.")
    packed_weights: PackedWeights = Field(default="auto", description="fastmode's engine, both models: "
                                          + _PACKED)
    draft_vocab: Annotated[int, Field(ge=16)] | Literal["auto"] | None = Field(default="auto",
        description="fastmode's engine: the fast model drafts from only this many of its tokens, the most "
        "frequent in the full model's answers (the fast model folder's token_counts.json, which fastmode "
        "distill writes): each draft step multiplies by that many rows of its head instead of the whole "
        "vocabulary's. The output is the same (the full model verifies every draft against its whole "
        "vocabulary); a draft it cannot propose is only a rejected one. 'auto': 4096 where the fast model "
        "has token counts and a vocabulary of at least 8192, else the whole vocabulary; null: the whole "
        "vocabulary (sharding/draft_vocab.py; how the default was measured: docs/decisions/).")

    @model_validator(mode="after")
    def _engine_fields(self) -> ExactLaneConfig:
        if self.engine == "vllm" and self.draft_vocab not in (None, "auto"):
            raise ValueError("draft_vocab is fastmode's engine's: set engine: fastmode, or draft_vocab: null")
        if self.engine == "fastmode":
            from sharding.speculative import K_MAX

            if self.num_speculative_tokens > K_MAX:
                raise ValueError(f"num_speculative_tokens: at most {K_MAX} on engine 'fastmode'")
            if self.num_speculative_tokens_per_batch_size:
                raise ValueError("num_speculative_tokens_per_batch_size is vLLM's: set engine: vllm")
            if self.dtype not in ("float32", "bfloat16", "float16"):
                raise ValueError(f"dtype {self.dtype!r}: engine 'fastmode' takes float32, bfloat16 or float16")
        return self


LANE_CONFIGS = {"fast": FastLaneConfig, "priority": PriorityLaneConfig, "standard": StandardLaneConfig,
                "exact": ExactLaneConfig}


class RouterConfig(_Strict):
    """How ``model: auto`` decides, and the router's own replicas."""

    auto_threshold: float = Field(default=6.762, gt=0, description="The difficulty (the prompt's mean "
        "per-token loss under the fast model, nats) that splits `auto`'s prompts between the fast lane and "
        "the full model (auto_fast_when says which side goes fast). The default is the shipped pair's "
        "(docs/lanes.md says how it was measured); another pair needs its own (python -m bench.auto_policy).")
    auto_fast_when: Literal["easy", "hard"] = Field(default="easy", description="'easy': prompts scored "
        "at most auto_threshold go to the fast lane (the shipped pair's policy: the student answers the "
        "prompts it finds easy as the full model does); 'hard': prompts above it go fast (a pair where "
        "neither model is often right on hard prompts).")
    auto_full_tier: Literal["default", "priority", "exact"] = Field(default="default", description="Where "
        "`auto` sends the prompts that do not go fast, unless the request names a service_tier: 'default' "
        "(the standard lane), 'priority' or 'exact'. When that lane is full, the request is served on "
        "standard (route.spilled_from). docs/lanes.md says how the default was measured.")
    auto_max_tokens: int = Field(default=128, ge=1, description="Score only the prompt's last N tokens.")
    lane_links: bool = Field(default=True, description="Stream from each lane replica over a direct TCP "
        "link (serve/lanes/lane_links.py: no Serve call per request, no Serve item per chunk); false: through "
        "Ray Serve's handles only.")
    head_links: bool = Field(default=True, description="With lane_links: each front door streams the fast "
        "lane from its ring's head chip itself (serve/lanes/head_links.py: the front door tokenizes and "
        "detokenizes; the lane replica, which owns the ring, is not on the request's path); false: through "
        "the fast lane's replica.")


class HTTPConfig(_Strict):
    host: str = Field(default="127.0.0.1", description="Bind address of the HTTP port.")
    port: int = Field(default=8000, ge=1, le=65535, description="HTTP port.")
    server: Literal["gateway", "serve"] = Field(default="gateway", description="Who listens on the port: "
        "'gateway': the gateway replica itself (each streamed chunk goes lane replica -> gateway -> client; "
        "gateway replicas on one node share the port); 'serve': Ray Serve's HTTP proxy on every node, which "
        "forwards each request and each chunk to a gateway replica (what `serve deploy` clusters and "
        "KubeRay's Service expect).")
    metrics_port: int = Field(default=8080, ge=1, le=65535, description="Prometheus metrics of a Ray that "
                              "fastmode up starts (Ray's metrics export port; ray_serve_* and ray_fastmode_*).")
    tls_certfile: str | None = Field(default=None, description="PEM certificate chain: with "
                                     "tls_keyfile, the port serves https and wss only (either http.server). "
                                     "A relative path is relative to the config file; it must exist on the "
                                     "node that listens.")
    tls_keyfile: str | None = Field(default=None, description="PEM private key of tls_certfile "
                                    "(unencrypted).")

    @model_validator(mode="after")
    def _tls_pair(self) -> HTTPConfig:
        _check_tls_pair(self)
        return self

    @property
    def tls(self) -> bool:
        return self.tls_certfile is not None


class TelemetryConfig(_Strict):
    """Which engine steps of the fast lane get spans (with their chip-to-chip hops) when tracing is
    on (``serve.telemetry``: the OpenTelemetry environment variables turn it on)."""

    step_spans_first: int = Field(default=8, ge=0, description="Spans for a request's prefill and its "
                                  "first N decode steps...")
    step_spans_every: int = Field(default=64, ge=1, description="...and every k-th decode step after. Hop "
                                  "totals (count, bytes, seconds, p50, p99) cover every step regardless.")
    record_content: bool = Field(default=False, description="Put prompts and outputs on the request spans "
        "(gen_ai.input.messages, gen_ai.output.messages) and error messages, which may quote the request, "
        "on their status. Off: spans carry ids, counts, timings and error codes only.")


class GrpcConfig(_Strict):
    """The internal gRPC API (``serve/rpc``)."""

    enabled: bool = Field(default=True, description="Serve fastmode.v1.Inference, health and reflection.")
    host: str = Field(default="127.0.0.1", description="Bind address of the gRPC port.")
    port: int = Field(default=9000, ge=1, le=65535, description="gRPC port.")
    tls_certfile: str | None = Field(default=None, description="PEM certificate chain: with tls_keyfile, "
                                     "the port serves gRPC over TLS only. A relative path is relative to the "
                                     "config file.")
    tls_keyfile: str | None = Field(default=None, description="PEM private key of tls_certfile "
                                    "(unencrypted).")

    @model_validator(mode="after")
    def _tls_pair(self) -> GrpcConfig:
        _check_tls_pair(self)
        return self

    @property
    def tls(self) -> bool:
        return self.tls_certfile is not None


def _check_tls_pair(section: HTTPConfig | GrpcConfig) -> None:
    if (section.tls_certfile is None) != (section.tls_keyfile is None):
        raise ValueError("tls_certfile and tls_keyfile go together: set both, or neither")


class GatewayConfig(_Strict):
    """Limits of the gateway's connections: the persistent WebSocket (``/v1/responses``) and, with
    ``http.server: gateway``, every HTTP request's head."""

    max_frame_bytes: int = Field(default=2**20, ge=1024, description="Largest client frame (text or "
                                 "binary); a bigger one closes the connection with 1009.")
    max_in_flight: int = Field(default=64, ge=1, description="Responses in flight per connection.")
    frames_per_s: float = Field(default=200.0, gt=0, description="Frames a connection may send per second, "
                                "sustained (a token bucket; pings do not count)...")
    frame_burst: int = Field(default=400, ge=1, description="...and at once. A frame over the budget is not "
                             "handled: it gets an error event (rate_limited, with retry_after in seconds). It "
                             "still spends a token, so a client that sends on regardless runs into debt; one that "
                             "owes frame_burst frames is closed with 1008.")
    max_connections_per_key: int = Field(default=256, ge=1, description="WebSocket connections one API key "
                                         "may hold on one gateway replica (without keys, all count as one "
                                         "key); one more gets an error event (too_many_connections) and close "
                                         "1008.")
    header_timeout_s: float = Field(default=10.0, gt=0, description="Each HTTP request's head (request line "
                                    "and headers, a WebSocket upgrade's too) must arrive within this, else 408 "
                                    "and close: a client trickling partial requests (slowloris) holds nothing "
                                    "for long. With http.server: gateway (Ray Serve's proxy has its own).")
    max_header_bytes: int = Field(default=65536, ge=1024, description="...and within this many bytes, else "
                                  "431 and close.")
    body_timeout_s: float = Field(default=30.0, gt=0, description="Each HTTP request's body must then arrive "
                                  "within this (from the end of its head; behind Ray Serve's proxy, from the "
                                  "request's start in the app), else 408 and close.")
    max_body_bytes: int = Field(default=8 * 2**20, ge=1024, description="...and be at most this many bytes, "
                                "else 413 and close (a larger content-length is refused before any body is "
                                "read); no route sees a refused body. Both hold with either http.server.")
    send_queue_events: int = Field(default=256, ge=8, description="Events queued for a connection's "
                                   "reader; while full, a response's deltas merge.")
    max_pending_chars: int = Field(default=65536, ge=1, description="Merged delta text a response may hold "
                                   "for a slow reader before it is cancelled with slow_consumer.")
    slow_reader_timeout_s: float = Field(default=10.0, gt=0, description="How long a response may wait for "
                                         "room in the send queue before it is cancelled with slow_consumer.")
    idle_timeout_s: float = Field(default=300.0, gt=0, description="Close a connection with nothing in "
                                  "flight and nothing received for this long (code 1000).")
    max_connection_age_s: float = Field(default=3600.0, gt=0, description="After this long a connection "
                                        "refuses new responses and closes (1001) once its last one ends.")
    responses_per_connection: int = Field(default=64, ge=0, description="Completed responses a connection "
                                          "keeps for previous_response_id (oldest evicted first; 0: none).")
    response_bytes_per_connection: int = Field(default=4 * 2**20, ge=0, description="Their conversations' "
                                               "text in bytes, at most.")
    stored_responses: int = Field(default=4096, ge=0, description="Responses created with store: true that "
                                  "each gateway replica keeps for any connection and the HTTP API (oldest "
                                  "evicted first; 0: none).")
    stored_response_bytes: int = Field(default=256 * 2**20, ge=0, description="Their conversations' text in "
                                       "bytes, at most.")


class AuthConfig(_Strict):
    """Where API keys come from (never from this file). Keys may be off only on a loopback bind,
    unless ``allow_public_without_keys`` says otherwise."""

    api_keys_env: str = Field(default="FASTMODE_API_KEYS", description="Environment variable holding "
                              "comma-separated API keys (in the gateway's process).")
    api_keys_file: str | None = Field(default=None, description="A file with one key per line, e.g. a "
                                      "mounted Kubernetes secret.")
    allow_public_without_keys: bool = Field(default=False, description="Serve HTTP or gRPC beyond loopback "
        "with no API keys: anyone who reaches the port may use every lane. Warned at every start; for a "
        "network that something else guards (fastmode up --insecure-no-auth sets it).")


class LanesConfig(_Strict):
    fast: FastLaneConfig = FastLaneConfig()
    priority: PriorityLaneConfig = PriorityLaneConfig()
    standard: StandardLaneConfig = StandardLaneConfig()
    exact: ExactLaneConfig = ExactLaneConfig()


class AppConfig(_Strict):
    """The whole application: models, lanes, router, HTTP."""

    name: str = Field(default="fastmode", description="Serve application name.")
    models: ModelsConfig = ModelsConfig()
    lanes: LanesConfig = LanesConfig()
    router: RouterConfig = RouterConfig()
    http: HTTPConfig = HTTPConfig()
    grpc: GrpcConfig = GrpcConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    gateway: GatewayConfig = GatewayConfig()
    auth: AuthConfig = AuthConfig()
    cpus: Annotated[str, BeforeValidator(lambda v: "off" if v is False else v),
                    AfterValidator(_cpus.validate)] = Field(default="auto", description="Where the "
        "processes of a node without a GPU run (sharding/cpus.py): 'off' (YAML's false) leaves placement to "
        "the OS; 'auto' keeps vLLM's rule, the node's last "
        "CPU for the serving processes (gateway, gRPC, lane replicas, vLLM's scheduler, Ray's daemons under "
        "fastmode up) and the others for compute (vLLM's workers, the fast lane's chips); a CPU list such "
        "as '1' or '6-7' names the serving CPUs. Nothing is placed on a node with a GPU. 'auto' keeps compute "
        "off the serving CPU, at the cost of a longer start and a slower /health (docs/cpu-placement.md).")
    serve_env: dict[str, str] = Field(default_factory=lambda: dict(SERVE_ENV), description="Environment "
        "variables of every replica of the application (Ray Serve's own knobs, read where its handles and "
        "replicas run). The default turns on Ray Serve's throughput-optimized mode (user code and handle "
        "routing on the replica's own event loop, handle-to-replica calls over gRPC, buffered request "
        "logs) without its direct ingress (the gateway listens itself, http.server). {} keeps Ray's defaults.")


    @model_validator(mode="after")
    def _door_without_tls(self) -> AppConfig:
        if self.lanes.fast.door and self.http.tls:
            raise ValueError("lanes.fast.door: the fast lane's door has no TLS; with http.tls_certfile set, "
                             "leave door unset or false")
        return self

    def door_on(self) -> bool:
        """Whether the fast lane's head serves its door (``lanes.fast.door``; null: unless TLS)."""
        door = self.lanes.fast.door
        return (not self.http.tls) if door is None else door


SERVE_ENV = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0"}
"""``serve_env``'s default (``ray.serve._private.constants``: what RAY_SERVE_THROUGHPUT_OPTIMIZED sets)."""


def load_config(source: str | Path | dict | AppConfig | None = None, *, resolve_models: bool = True) -> AppConfig:
    """Validate a config given as a YAML path, a dict, or ``None`` (the defaults).

    ``resolve_models``: model paths become the checkpoint folders this machine loads (GGUF files
    converted, built-ins made ready, students assembled: ``models.builtin.resolve``); ``False``: they
    are only checked and made absolute, built-in names kept (``models.builtin.locate``), for configs
    rendered for other machines (a cluster's nodes, KubeRay pods).

    Relative model and TLS file paths are resolved against the YAML file's directory (or the working
    directory for a dict), and must exist. Raises ``ConfigError`` naming the field and what is wrong
    with it.
    """
    if isinstance(source, AppConfig):
        return source
    origin, base = "config", Path.cwd()
    if source is None:
        data: Any = {}
    elif isinstance(source, dict):
        data = source
    else:
        path = Path(source)
        origin, base = str(path), path.resolve().parent
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except OSError as e:
            raise ConfigError(f"{path}: cannot read the config: {e.strerror or e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from None
    config = validate_mapping(AppConfig, data, origin, ConfigError)
    models = {}
    for key in ("full", "fast"):
        spec = getattr(config.models, key)
        # A checkpoint folder, a GGUF file (converted once), builtin:NAME, or a distilled student
        # (assembled with the full model): models/builtin.py.
        from models.builtin import ModelPathError, locate, resolve

        try:
            if resolve_models:
                path = str(resolve(spec.path, base=base, full=Path(models["full"].path) if key == "fast" else None).resolve())
            else:
                path = locate(spec.path, base=base)
        except ModelPathError as e:
            raise ConfigError(f"{origin}: models.{key}.path: {e}") from None
        update_spec: dict[str, Any] = {"path": path}
        if spec.chat_template is not None and "{" not in spec.chat_template:  # a file's path, not a template
            file = base / Path(spec.chat_template).expanduser()
            if not file.is_file():
                raise ConfigError(f"{origin}: models.{key}.chat_template: no template file at {file}")
            update_spec["chat_template"] = file.read_text()
        models[key] = spec.model_copy(update=update_spec)
    update: dict[str, Any] = {"models": config.models.model_copy(update=models)}
    for name in ("http", "grpc"):
        section = getattr(config, name)
        files = {}
        for key in ("tls_certfile", "tls_keyfile"):
            if getattr(section, key) is not None:
                path = base / Path(getattr(section, key)).expanduser()
                if not path.is_file():
                    raise ConfigError(f"{origin}: {name}.{key}: no file at {path}")
                files[key] = str(path.resolve())
        if files:
            _load_tls(files["tls_certfile"], files["tls_keyfile"], f"{origin}: {name}")
            update[name] = section.model_copy(update=files)
    return config.model_copy(update=update)


def _load_tls(certfile: str, keyfile: str, where: str) -> None:
    """Raise ``ConfigError`` unless the certificate and key load as a pair (now, not once a server starts)."""
    import ssl

    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(certfile, keyfile, password=b"")
    except (ssl.SSLError, OSError) as e:
        raise ConfigError(f"{where}.tls_certfile, tls_keyfile: cannot load them as a PEM certificate and its "
                          f"unencrypted key: {e}") from None


def dump_config(config: AppConfig) -> str:
    """``config`` as YAML (what ``fastmode up --print-config`` shows)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
