"""Spans for the fast lane's engine steps and their chip-to-chip hops, and per-request hop totals.

An engine step serves every request in its batch; each request's trace gets the steps it took
part in (its prefill, its first ``first`` decode steps and every ``every``-th after), each with a
child span per hop timed by the hop's own record: ``[received_at - seconds, received_at]``. Totals
over every step (count, bytes, seconds, p50, p99 per request) go on the lane span at the end, and,
per chip pair, on the response's ``done`` event (``HopTotals.per_pair``) whether traced or not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.context import Context

from sharding.batch import Hop
from sharding.ring import StepInfo

from ..telemetry import tracer


@dataclass
class HopTotals:
    """Every hop of a request's steps: overall percentiles and, per chip pair, count / seconds /
    max / bytes (what ``fastmode trace``'s heatmap needs, for every step, not only the sampled ones)."""

    seconds: list[float] = field(default_factory=list)
    bytes: int = 0
    pairs: dict[tuple[str, str], list] = field(default_factory=dict)

    def add(self, hops: list[Hop]) -> None:
        for h in hops:
            self.seconds.append(h.seconds)
            self.bytes += h.bytes
            p = self.pairs.get((h.src_chip, h.dst_chip))
            if p is None:
                self.pairs[(h.src_chip, h.dst_chip)] = [1, h.seconds, h.seconds, h.bytes]
            else:
                p[0] += 1
                p[1] += h.seconds
                p[2] = max(p[2], h.seconds)
                p[3] += h.bytes

    def per_pair(self) -> list[dict[str, str | int | float]]:
        """One entry per chip pair (sender, receiver): hops, their seconds in total and at most, bytes."""
        return [{"src": a, "dst": b, "count": n, "seconds": s, "max_seconds": m, "bytes": nb}
                for (a, b), (n, s, m, nb) in sorted(self.pairs.items())]

    def attributes(self) -> dict[str, float | int | list]:
        s = sorted(self.seconds)
        if not s:
            return {"fastmode.hops.count": 0}
        pairs = sorted(self.pairs.items())
        return {"fastmode.hops.count": len(s), "fastmode.hops.bytes": self.bytes,
                "fastmode.hops.seconds_total": sum(s), "fastmode.hops.seconds_p50": s[len(s) // 2],
                "fastmode.hops.seconds_p99": s[min(len(s) - 1, int(0.99 * len(s)))],
                # One entry per chip pair, in the same order in every array.
                "fastmode.hops.pair": [f"{a}->{b}" for (a, b), _ in pairs],
                "fastmode.hops.pair_count": [v[0] for _, v in pairs],
                "fastmode.hops.pair_seconds": [v[1] for _, v in pairs],
                "fastmode.hops.pair_max_seconds": [v[2] for _, v in pairs],
                "fastmode.hops.pair_bytes": [v[3] for _, v in pairs]}


class StepSpans:
    """One request's step spans, under its lane span's context ``parent``."""

    def __init__(self, parent: Context, first: int, every: int, layout: dict[str, int]) -> None:
        self.parent, self.first, self.every, self.layout = parent, first, every, layout
        self.index = 0  # 0: the prefill step; then decode steps 1, 2, ...

    def step(self, info: StepInfo) -> None:
        i, self.index = self.index, self.index + 1
        if not (i <= self.first or i % self.every == 0):
            return
        name = "fastmode.prefill" if i == 0 else "fastmode.decode"
        span = tracer().start_span(name, context=self.parent, start_time=info.start_ns, attributes={
            "fastmode.step": i, "fastmode.batch_size": info.batch_size, "fastmode.hops.count": len(info.hops),
            **self.layout})
        ctx = trace.set_span_in_context(span)
        for h in info.hops:
            end = h.received_at or info.end_ns
            hop = tracer().start_span(f"fastmode.hop {h.src_chip}->{h.dst_chip}", context=ctx,
                                      start_time=end - int(h.seconds * 1e9), attributes={
                "fastmode.hop.src_chip": h.src_chip, "fastmode.hop.dst_chip": h.dst_chip,
                "fastmode.hop.src_stage": h.src_stage, "fastmode.hop.dst_stage": h.dst_stage,
                "fastmode.hop.bytes": h.bytes, "fastmode.hop.transport": h.transport,
                "fastmode.hop.seconds": h.seconds})
            hop.end(end_time=end)
        span.end(end_time=info.end_ns)

    def finish(self, totals: HopTotals) -> None:
        """Put the request's hop totals (over every step, sampled or not) on the lane span."""
        trace.get_current_span(self.parent).set_attributes({**totals.attributes(),
                                                            "fastmode.steps": self.index})
