"""``StageRunner`` helpers: how much of the KV cache a step attends over."""

from __future__ import annotations

from sharding.stage import SPAN_BUCKET, span_for


def test_attention_span_is_bucketed_and_capped():
    assert span_for(1, 512) == SPAN_BUCKET == span_for(SPAN_BUCKET, 512)
    assert span_for(SPAN_BUCKET + 1, 512) == 2 * SPAN_BUCKET
    assert span_for(500, 512) == 512 and span_for(100, 100) == 100
