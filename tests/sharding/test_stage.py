"""``StageRunner`` helpers: how much of the KV cache a step attends over."""

from __future__ import annotations

import torch

from sharding.stage import SPAN_BUCKET, span_for


def test_attention_span_is_bucketed_and_capped():
    assert span_for(1, 512) == SPAN_BUCKET == span_for(SPAN_BUCKET, 512)
    assert span_for(SPAN_BUCKET + 1, 512) == 2 * SPAN_BUCKET
    assert span_for(500, 512) == 512 and span_for(100, 100) == 100


class _Scaled(torch.nn.Module):
    """A module whose forward branches on a plain attribute: Dynamo bakes the branch into the graph
    and guards on the attribute through the module (a guard ``compile_method`` skips)."""

    def __init__(self, double: bool) -> None:
        super().__init__()
        self.double = double

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if self.double else x + 1


def test_compile_method_keeps_each_models_graphs_apart(monkeypatch):
    """Guards on modules are skipped, so two models of one class with the same inputs would pick each
    other's graphs through a shared code object; ``own_code`` gives each its own."""
    from sharding import stage

    monkeypatch.setattr(stage, "BACKEND", "eager")
    torch._dynamo.reset()
    x = torch.ones(3)
    double, plus = _Scaled(True), _Scaled(False)
    f, g = (stage.compile_method(m.forward, cpp_wrapper=False) for m in (double, plus))
    for _ in range(2):
        assert f(x).tolist() == [2.0] * 3 and g(x).tolist() == [2.0] * 3  # 1 * 2 and 1 + 1
        assert f(x + 1).tolist() == [4.0] * 3 and g(x + 1).tolist() == [3.0] * 3
    # the same without a code object of their own: the second model runs the first one's graph
    monkeypatch.setattr(stage, "own_code", lambda method: method)
    torch._dynamo.reset()
    f, g = (stage.compile_method(m.forward, cpp_wrapper=False) for m in (double, plus))
    assert f(x + 1).tolist() == [4.0] * 3 and g(x + 1).tolist() == [4.0] * 3  # wrong: x * 2
