"""Typed errors of the sharded executor, each with a stable ``code``.

The codes are the wire contract: the serving front doors (WebSocket, HTTP, gRPC) translate a
``ShardingError`` once, by its ``code``, so they must never change meaning. Every error is a
``ValueError`` because each is raised for input the caller could have checked.
"""

from __future__ import annotations

from typing import ClassVar


class ShardingError(ValueError):
    """Base of every error raised by ``sharding``; ``code`` names the fault for clients."""

    code: ClassVar[str] = "sharding_error"


class InvalidConfig(ShardingError):
    """A model ``config.json`` (or a ``ModelConfig``) that this executor cannot run."""

    code = "invalid_config"


class InvalidLayout(ShardingError):
    """A parallel layout that does not fit the model (tp not dividing heads, bad layer range, ...)."""

    code = "invalid_layout"


class CheckpointError(ShardingError):
    """A checkpoint missing a tensor the model needs, or holding one of the wrong shape."""

    code = "bad_checkpoint"


class InvalidSamplingParams(ShardingError):
    """Sampling parameters out of range (negative temperature, top_p outside (0, 1], ...)."""

    code = "invalid_sampling_params"


class EmptyPrompt(ShardingError):
    """A request with no prompt tokens (there is nothing to condition on)."""

    code = "empty_prompt"


class PromptTooLong(ShardingError):
    """A prompt whose length plus ``max_tokens`` does not fit the context window."""

    code = "prompt_too_long"


class TokenOutOfRange(ShardingError):
    """A prompt token id outside ``[0, vocab_size)``."""

    code = "token_out_of_range"


class DuplicateRequest(ShardingError):
    """A request id that is already waiting or running."""

    code = "duplicate_request"


class CacheFull(ShardingError):
    """No free KV-cache slot is left (the engine queues instead of raising this)."""

    code = "kv_cache_full"


class NotEnoughChips(ShardingError):
    """The Ray cluster has fewer ``chip`` resources than the layout needs (or none free in time)."""

    code = "not_enough_chips"
