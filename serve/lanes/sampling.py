"""The sampling parameters a lane gives its engine, resolved once for every lane and the fast
lane's door (``engine_request``).

A field of ``serve.request.MODEL_DEFAULTS`` the request left unset takes the value of the model's
``generation_config.json`` (``temperature``, ``top_p``, ``top_k``, ``min_p`` and the three
penalties, where the file sets them), else the engines' own default (``sharding.sampling``): what
vLLM's OpenAI server does with ``--generation-config auto``, its default. Its ``max_new_tokens`` is
the default ``max_output_tokens`` (``output_budget``), as vLLM's ``max_tokens`` default: a request
without one gets the rest of the context, or that many tokens if fewer. The request's
``stop_token_ids`` join the model's end-of-turn ids (``serve.chat.end_of_turn_ids``) unless
``ignore_eos``, which drops only the latter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sharding.errors import InvalidSamplingParams, PromptTooLong
from sharding.sampling import SamplingParams

from ..errors import InvalidRequest
from ..request import MODEL_DEFAULTS, LaneRequest
from .engine import EngineRequest


def generation_defaults(path: str | Path) -> dict[str, Any]:
    """The sampling defaults in ``path``'s ``generation_config.json`` (none without one); ``ValueError``
    if they are out of range (checked at the lane's start, not on a user's request)."""
    file = Path(path) / "generation_config.json"
    config = json.loads(file.read_text()) if file.exists() else {}
    defaults = {name: config[name] for name in MODEL_DEFAULTS if config.get(name) is not None}
    try:
        SamplingParams(**defaults)
    except InvalidSamplingParams as e:
        raise ValueError(f"{file}: {e}") from None
    return defaults


def default_max_tokens(path: str | Path) -> int | None:
    """``generation_config.json``'s ``max_new_tokens`` at ``path`` (``None`` without one), which vLLM's
    server takes as the default ``max_tokens`` (``ModelConfig.get_diff_sampling_param``); ``ValueError``
    unless it is a whole number of at least 1 (checked at the lane's start)."""
    file = Path(path) / "generation_config.json"
    value = json.loads(file.read_text()).get("max_new_tokens") if file.exists() else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{file}: max_new_tokens must be an integer >= 1, got {value!r}")
    return value


def output_budget(max_output_tokens: int | None, prompt_tokens: int, max_len: int, default: int | None,
                  model_id: str) -> int:
    """The tokens a response may have: the request's ``max_output_tokens``, else the rest of the
    ``max_len``-token context, capped by the model's ``default`` (``default_max_tokens``), as vLLM's
    ``get_max_tokens``; ``PromptTooLong`` when the prompt and the request's own budget do not fit."""
    rest = max_len - prompt_tokens
    budget = max_output_tokens or (rest if default is None else min(rest, default))
    if budget > rest or budget < 1:
        raise PromptTooLong(f"the prompt has {prompt_tokens} tokens; with max_output_tokens {budget} it exceeds "
                            f"the {max_len}-token context of {model_id}")
    return budget


def vocab_size(path: str | Path) -> int:
    """The vocabulary of the checkpoint at ``path`` (``config.json``, or its ``text_config``)."""
    config = json.loads((Path(path) / "config.json").read_text())
    return int(config.get("vocab_size") or config["text_config"]["vocab_size"])


def engine_request(request: LaneRequest, prompt_ids: list[int], max_tokens: int, *, defaults: dict[str, Any],
                   stop_ids: tuple[int, ...], vocab_size: int, continues: bool = False,
                   trace: Any = None) -> EngineRequest:
    """``request`` as an engine takes it: each unset field resolved (the module docstring), the model's
    end-of-turn ids added to ``stop_token_ids``. ``InvalidRequest`` names a field that does not fit
    this model (a ``logit_bias`` token outside its vocabulary, ``min_tokens`` past ``max_tokens``)."""
    resolved = {name: getattr(request, name) if getattr(request, name) is not None
                else defaults.get(name, getattr(SamplingParams, name)) for name in MODEL_DEFAULTS}
    bias = request.logit_bias or {}
    if bad := sorted(t for t in bias if t >= vocab_size):
        raise InvalidRequest(f"logit_bias: token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
    if request.min_tokens > max_tokens:
        raise InvalidRequest(f"min_tokens: {request.min_tokens} is more than the {max_tokens} tokens this "
                             "response may have")
    ends = () if request.ignore_eos else tuple(t for t in stop_ids if t not in request.stop_token_ids)
    return EngineRequest(request_id=request.request_id, prompt_ids=prompt_ids, max_tokens=max_tokens,
                         **resolved, seed=request.seed, logit_bias=tuple(sorted(bias.items())),
                         stop=list(request.stop), stop_token_ids=tuple(request.stop_token_ids) + ends,
                         min_tokens=request.min_tokens, logprobs=request.logprobs, ignore_eos=request.ignore_eos,
                         continues=continues,
                         trace=trace)
