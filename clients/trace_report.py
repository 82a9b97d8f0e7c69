"""``fastmode trace FILE``: what the fast lane's chip-to-chip hops cost, from exported spans.

Reads OTLP JSON spans (docs/observability.md): one ``ExportTraceServiceRequest`` per line (what
``FASTMODE_TRACE_FILE`` writes, and an OpenTelemetry Collector's ``file`` exporter too), a single
such document, or a JSON array of them. Ids may be base64 (protobuf's JSON mapping) or hex,
int64s strings or numbers, field names camelCase or snake_case.

It prints one row per chip pair (sender -> receiver, with their pipeline stages)::

    src -> dst                       stages  hops  bytes/hop  bytes total  p50 ms  p99 ms  share
    driver -> 10.0.0.1/chip0         d -> 0    27       16 B        432 B   0.412   0.903   4.1%

- *hops*: hop spans of the pair; *bytes/hop*: their mean payload; *bytes total*: the sum;
- *p50/p99*: of the hops' ``fastmode.hop.seconds`` (nearest rank, as the lane span's totals);
- *share*: the pair's hop seconds over the summed durations of the step spans holding them, so
  the share of step time spent moving data between those two chips (hops of different pairs
  overlap in time, so shares do not add up to 100%).

and writes to ``--out`` (default ``<FILE stem>_report/`` next to FILE):

- ``heatmap.png``: chip-to-chip matrix (rows: sender, columns: receiver, the driver included),
  colored by median hop milliseconds, each cell annotated with its hop count;
- ``waterfall.png``: one trace's step spans (``--trace-id``; default: the trace with the most),
  one row per step (the first 80), with their hops drawn inside as segments colored by chip pair,
  each pair in its own thin lane; x axis in ms from the first step's start.

Step spans are the fast lane's ``fastmode.prefill``/``fastmode.decode`` spans (those carrying the
layout or holding hop spans; vLLM lanes' step spans have neither); a request is the lane span
they hang from.

``--json`` prints the table (and the header's counts) as one JSON object instead. Errors (no such
file, not JSON, no step or hop spans, unknown trace id) print ``fastmode trace: <message>`` to
stderr and exit 1; usage errors exit 2.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STEP_NAMES = ("fastmode.prefill", "fastmode.decode")
HOP_PREFIX = "fastmode.hop "
LANE_NAME = "fastmode.lane fast"
DRIVER = "driver"
DRIVER_STAGE = -1
MAX_WATERFALL_STEPS = 80


class TraceReportError(Exception):
    """A problem with the input: the message is printed as ``fastmode trace: <message>``, exit 1."""


@dataclass(frozen=True)
class Span:
    trace_id: str
    """Lowercase hex (32 digits for a well-formed id)."""
    span_id: str
    parent_id: str
    """Lowercase hex, ``""`` for a root span."""
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]

    @property
    def seconds(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9


# ---------------------------------------------------------------------------------------------- reading


def _get(d: dict, camel: str, snake: str, default: Any = None) -> Any:
    return d[camel] if camel in d else d.get(snake, default)


def normalize_id(value: Any, nbytes: int) -> str:
    """An OTLP JSON trace or span id as lowercase hex: hex as it is, base64 (standard or URL-safe)
    decoded; ``""`` for an empty or missing id."""
    if not value:
        return ""
    s = str(value).strip()
    if len(s) == 2 * nbytes and all(c in "0123456789abcdefABCDEF" for c in s):
        return s.lower()
    try:
        raw = base64.b64decode(s + "=" * (-len(s) % 4), altchars=b"-_" if ("-" in s or "_" in s) else None,
                               validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) == nbytes:
        return raw.hex()
    if s and all(c in "0123456789abcdefABCDEF" for c in s):  # hex of another length
        return s.lower()
    return s  # unrecognised: keep it as an opaque key


def _int(value: Any) -> int:
    if value is None or value == "":
        return 0
    return int(value)


def _float(value: Any) -> float:
    if isinstance(value, str):  # protobuf's JSON for non-finite doubles: "NaN", "Infinity", "-Infinity"
        return float(value.replace("Infinity", "inf"))
    return float(value)


def any_value(v: Any) -> Any:
    """The Python value of an OTLP JSON ``AnyValue``."""
    if not isinstance(v, dict):
        return v
    for camel, snake, conv in (("stringValue", "string_value", str), ("boolValue", "bool_value", bool),
                               ("intValue", "int_value", _int), ("doubleValue", "double_value", _float)):
        if camel in v or snake in v:
            return conv(_get(v, camel, snake))
    if "arrayValue" in v or "array_value" in v:
        return [any_value(x) for x in (_get(v, "arrayValue", "array_value") or {}).get("values", [])]
    if "kvlistValue" in v or "kvlist_value" in v:
        return attributes((_get(v, "kvlistValue", "kvlist_value") or {}).get("values", []))
    if "bytesValue" in v or "bytes_value" in v:
        return base64.b64decode(_get(v, "bytesValue", "bytes_value"))
    return None  # an empty AnyValue


def attributes(kvs: Iterable[dict] | None) -> dict[str, Any]:
    return {kv["key"]: any_value(kv.get("value")) for kv in kvs or () if isinstance(kv, dict) and "key" in kv}


def _documents(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, document) for each JSON document in the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceReportError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise TraceReportError(f"{path} is a directory, not a span file") from None
    except UnicodeDecodeError:
        raise TraceReportError(f"{path} is not JSON (not UTF-8 text)") from None
    except OSError as e:
        raise TraceReportError(f"cannot read {path}: {e.strerror or e}") from None
    if not text.strip():
        raise TraceReportError(f"{path} is empty")
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        pass
    else:  # one document, or an array of them
        for i, doc in enumerate(whole if isinstance(whole, list) else [whole]):
            yield (f"{path} item {i}" if isinstance(whole, list) else str(path)), doc
        return
    for n, line in enumerate(text.splitlines(), 1):  # JSON lines
        if not line.strip():
            continue
        try:
            yield f"{path}:{n}", json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceReportError(f"{path} is not JSON or JSON lines: line {n}, column {e.colno}: {e.msg}") \
                from None


def load_spans(path: str | Path) -> list[Span]:
    """Every span in an OTLP JSON file, deduplicated by (trace id, span id)."""
    path = Path(path)
    spans: dict[tuple[str, str], Span] = {}
    for where, doc in _documents(path):
        if not isinstance(doc, dict):
            raise TraceReportError(f"{where}: expected an OTLP ExportTraceServiceRequest object, "
                                   f"got a JSON {type(doc).__name__}")
        for rs in _get(doc, "resourceSpans", "resource_spans") or []:
            for ss in _get(rs, "scopeSpans", "scope_spans") or _get(rs, "instrumentationLibrarySpans",
                                                                      "instrumentation_library_spans") or []:
                for s in ss.get("spans") or []:
                    try:
                        span = Span(trace_id=normalize_id(_get(s, "traceId", "trace_id"), 16),
                                    span_id=normalize_id(_get(s, "spanId", "span_id"), 8),
                                    parent_id=normalize_id(_get(s, "parentSpanId", "parent_span_id"), 8),
                                    name=str(s.get("name", "")),
                                    start_ns=_int(_get(s, "startTimeUnixNano", "start_time_unix_nano")),
                                    end_ns=_int(_get(s, "endTimeUnixNano", "end_time_unix_nano")),
                                    attributes=attributes(s.get("attributes")))
                    except (TypeError, ValueError, AttributeError, binascii.Error) as e:
                        raise TraceReportError(f"{where}: malformed span {s.get('name')!r}: {e}") from None
                    spans[(span.trace_id, span.span_id)] = span
    return list(spans.values())


# ---------------------------------------------------------------------------------------------- analysis


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest rank, as the lane span's ``fastmode.hops.seconds_p50/_p99``."""
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


@dataclass(frozen=True, order=True)
class Pair:
    src_stage: int
    dst_stage: int
    src: str
    dst: str

    def sort_key(self) -> tuple:
        # driver -> stage 0 first, last stage -> driver last
        return (self.src_stage, self.dst_stage if self.dst_stage >= 0 else 1 << 30, self.src, self.dst)

    @property
    def label(self) -> str:
        return f"{self.src} -> {self.dst}"

    @property
    def stages(self) -> str:
        def st(s: int) -> str:
            return "d" if s == DRIVER_STAGE else str(s)
        return f"{st(self.src_stage)} -> {st(self.dst_stage)}"


@dataclass
class PairStats:
    pair: Pair
    seconds: list[float] = field(default_factory=list)
    bytes: list[int] = field(default_factory=list)
    transports: set[str] = field(default_factory=set)
    in_steps_seconds: float = 0.0
    """Hop seconds of the hops whose step span is in the file (the share's numerator)."""
    steps: set[tuple[str, str]] = field(default_factory=set)
    """(trace id, span id) of the step spans holding this pair's hops."""

    def row(self, step_seconds: dict[tuple[str, str], float]) -> dict[str, Any]:
        s = sorted(self.seconds)
        denom = sum(step_seconds[k] for k in self.steps)
        return {"src": self.pair.src, "dst": self.pair.dst, "src_stage": self.pair.src_stage,
                "dst_stage": self.pair.dst_stage, "transport": sorted(self.transports), "hops": len(s),
                "bytes_mean": sum(self.bytes) / len(self.bytes) if self.bytes else 0.0,
                "bytes_total": sum(self.bytes), "seconds_total": sum(s),
                "p50_ms": percentile(s, 0.5) * 1e3, "p99_ms": percentile(s, 0.99) * 1e3,
                "steps": len(self.steps), "step_seconds": denom,
                "share": self.in_steps_seconds / denom if denom > 0 else None}


@dataclass
class Report:
    spans: list[Span]
    steps: list[Span]
    hops: list[Span]
    pairs: dict[Pair, PairStats]
    step_of: dict[tuple[str, str], Span]
    """(trace id, hop span id) -> the step span holding the hop."""
    traces: list[str]
    requests: int
    layouts: Counter
    rows: list[dict[str, Any]]

    def summary(self) -> dict[str, Any]:
        return {"traces": len(self.traces), "requests": self.requests, "step_spans": len(self.steps),
                "hop_spans": len(self.hops),
                "layouts": [{"tp": tp, "pp": pp, "transport": t, "steps": n}
                            for (tp, pp, t), n in sorted(self.layouts.items(), key=lambda kv: -kv[1])]}

    def steps_per_trace(self) -> Counter:
        return Counter(s.trace_id for s in self.steps)


def is_hop(span: Span) -> bool:
    return span.name.startswith(HOP_PREFIX) or "fastmode.hop.src_chip" in span.attributes


def hop_pair(hop: Span) -> Pair:
    """The hop's (sender, receiver) from its attributes, or from its name ``fastmode.hop {src}->{dst}``."""
    a = hop.attributes
    src, dst = a.get("fastmode.hop.src_chip"), a.get("fastmode.hop.dst_chip")
    if src is None or dst is None:
        src, _, dst = hop.name[len(HOP_PREFIX):].partition("->")
    src_stage = a.get("fastmode.hop.src_stage", DRIVER_STAGE if src == DRIVER else 0)
    dst_stage = a.get("fastmode.hop.dst_stage", DRIVER_STAGE if dst == DRIVER else 0)
    return Pair(int(src_stage), int(dst_stage), str(src), str(dst))


def analyze(spans: list[Span]) -> Report:
    """The per-pair statistics of every hop span and the step spans that hold them."""
    by_id = {(s.trace_id, s.span_id): s for s in spans}
    hops = [s for s in spans if is_hop(s)]
    hop_parents = {(h.trace_id, h.parent_id) for h in hops}
    # fast-lane steps: they carry the layout or hold hops (vLLM lanes' step spans have neither)
    steps = [s for s in spans if s.name in STEP_NAMES
             and ("fastmode.tp" in s.attributes or (s.trace_id, s.span_id) in hop_parents)]
    step_keys = {(s.trace_id, s.span_id) for s in steps}
    if not steps and not hops:
        raise TraceReportError("no fastmode step or hop spans found (is this a trace of the fast lane, "
                               "exported with FASTMODE_TRACE_FILE or an OTLP file exporter?)")
    step_of: dict[tuple[str, str], Span] = {}
    pairs: dict[Pair, PairStats] = {}
    for h in hops:
        a = h.attributes
        pair = hop_pair(h)
        st = pairs.setdefault(pair, PairStats(pair))
        sec = float(a["fastmode.hop.seconds"]) if "fastmode.hop.seconds" in a else h.seconds
        st.seconds.append(sec)
        st.bytes.append(int(a.get("fastmode.hop.bytes", 0)))
        if a.get("fastmode.hop.transport"):
            st.transports.add(str(a["fastmode.hop.transport"]))
        parent = (h.trace_id, h.parent_id)
        if parent in step_keys:
            step_of[(h.trace_id, h.span_id)] = by_id[parent]
            st.steps.add(parent)
            st.in_steps_seconds += sec
    step_seconds = {(s.trace_id, s.span_id): s.seconds for s in steps}
    rows = [pairs[p].row(step_seconds) for p in sorted(pairs, key=Pair.sort_key)]
    layouts = Counter((s.attributes.get("fastmode.tp"), s.attributes.get("fastmode.pp"),
                       s.attributes.get("fastmode.transport")) for s in steps)
    traces = list(dict.fromkeys(s.trace_id for s in steps + hops))
    # a request: one lane span holding fast-lane steps (its steps' parent), or a lane span seen alone
    requests = {(s.trace_id, s.parent_id) for s in steps}
    requests |= {(s.trace_id, s.span_id) for s in spans if s.name == LANE_NAME and s.trace_id in set(traces)}
    return Report(spans=spans, steps=steps, hops=hops, pairs=pairs, step_of=step_of, traces=traces,
                  requests=len(requests), layouts=layouts, rows=rows)


# ---------------------------------------------------------------------------------------------- output


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def header_line(report: Report) -> str:
    s = report.summary()
    layouts = ", ".join(f"tp{lay['tp']} x pp{lay['pp']} {lay['transport']} ({plural(lay['steps'], 'step')})"
                        for lay in s["layouts"]) or "none"
    return (f"{plural(s['traces'], 'trace')} · {plural(s['requests'], 'request')} · "
            f"{plural(s['step_spans'], 'step span')} · {plural(s['hop_spans'], 'hop span')} · "
            f"layouts: {layouts}")


def format_table(report: Report) -> str:
    head = ["src -> dst", "stages", "transport", "hops", "bytes/hop", "bytes total", "p50 ms", "p99 ms",
            "share"]
    body = [[f"{r['src']} -> {r['dst']}", Pair(r["src_stage"], r["dst_stage"], r["src"], r["dst"]).stages,
             ",".join(r["transport"]) or "-", str(r["hops"]), human_bytes(r["bytes_mean"]),
             human_bytes(r["bytes_total"]), f"{r['p50_ms']:.3f}", f"{r['p99_ms']:.3f}",
             "-" if r["share"] is None else f"{100 * r['share']:.1f}%"] for r in report.rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    left = {0, 1, 2}

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([header_line(report), "", fmt(head), *(fmt(b) for b in body)])


def _chips(report: Report) -> list[tuple[str, int]]:
    """(chip, stage) in order: the driver, then chips by stage and name."""
    seen: dict[str, int] = {}
    for p in report.pairs:
        seen.setdefault(p.src, p.src_stage)
        seen.setdefault(p.dst, p.dst_stage)
    return sorted(seen.items(), key=lambda kv: (kv[0] != DRIVER, kv[1], kv[0]))


def _short_names(chips: list[str]) -> tuple[dict[str, str], str]:
    """Chip labels without a node prefix common to all chips, and that prefix."""
    nodes = {c.rpartition("/")[0] for c in chips if c != DRIVER}
    if len(nodes) == 1 and all("/" in c for c in chips if c != DRIVER):
        node = nodes.pop()
        return {c: c.rpartition("/")[2] if c != DRIVER else c for c in chips}, node
    return {c: c for c in chips}, ""


def plot_heatmap(report: Report, path: Path) -> Path:
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    chips = _chips(report)
    names = [c for c, _ in chips]
    short, node = _short_names(names)
    labels = [f"{short[c]}" + ("" if c == DRIVER else f" [s{st}]") for c, st in chips]
    idx = {c: i for i, c in enumerate(names)}
    n = len(names)
    med = np.full((n, n), np.nan)
    count = np.zeros((n, n), dtype=int)
    for p, st in report.pairs.items():
        i, j = idx[p.src], idx[p.dst]
        s = sorted(st.seconds)
        med[i, j] = percentile(s, 0.5) * 1e3
        count[i, j] = len(s)
    size = min(20.0, max(4.5, 1.1 * n + 2.5))
    annotate = n <= 16
    fig = Figure(figsize=(size + 1.2, size))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    im = ax.imshow(np.ma.masked_invalid(med), cmap=colormaps["viridis"].with_extremes(bad="#eeeeee"),
                   origin="upper")
    fig.colorbar(im, ax=ax, label="median hop ms")
    finite = med[np.isfinite(med)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    for i in range(n):
        for j in range(n):
            if annotate and count[i, j]:
                bright = hi > lo and (med[i, j] - lo) / (hi - lo) > 0.6
                ax.text(j, i, f"{med[i, j]:.2f} ms\nn={count[i, j]}", ha="center", va="center", fontsize=8,
                        color="black" if bright else "white")
    ax.set_xticks(range(n), labels, rotation=30, ha="right")
    ax.set_yticks(range(n), labels)
    ax.set_xlabel("to (receiver)")
    ax.set_ylabel("from (sender)")
    s = report.summary()
    ax.set_title(f"chip-to-chip hops: median ms (n = hops){' · node ' + node if node else ''}\n"
                 f"{plural(s['hop_spans'], 'hop')} in {plural(s['step_spans'], 'step')} of "
                 f"{plural(s['requests'], 'request')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def choose_trace(report: Report, trace_id: str | None) -> str:
    """The trace to draw: ``trace_id`` (hex or base64, or a unique hex prefix), or the one with the
    most step spans."""
    per = report.steps_per_trace()
    if not per:
        raise TraceReportError("no step spans found: nothing to draw a waterfall of")
    if trace_id is None:
        order = {t: i for i, t in enumerate(report.traces)}
        return max(per, key=lambda t: (per[t], -order[t]))
    want = normalize_id(trace_id, 16).lower()
    matches = [t for t in per if t == want] or [t for t in per if t.startswith(want)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        known = ", ".join(sorted(per)[:5]) + (" ..." if len(per) > 5 else "")
        raise TraceReportError(f"no step spans in trace {trace_id!r} (traces with steps: {known})")
    raise TraceReportError(f"trace id prefix {trace_id!r} is ambiguous ({len(matches)} traces)")


@dataclass
class TimeAxis:
    """The waterfall's x axis: true ms from the first step's start, with idle gaps between sampled
    steps (prefill, decode 1..8, then every 64th) shortened to ``gap`` so the steps stay readable."""

    groups: list[list[float]]
    """[start, end] in true ms of each run of steps with no long gap inside."""
    offsets: list[float]
    gap: float

    @classmethod
    def of(cls, extents: list[tuple[float, float]]) -> TimeAxis:
        durations = sorted(e - s for s, e in extents)
        typical = max(durations[len(durations) // 2], 1e-3)
        groups: list[list[float]] = []
        for s, e in sorted(extents):
            if groups and s - groups[-1][1] <= 4 * typical:
                groups[-1][1] = max(groups[-1][1], e)
            else:
                groups.append([s, e])
        gap = max(typical, 0.03 * sum(e - s for s, e in groups))
        offsets, x = [], 0.0
        for s, e in groups:
            offsets.append(x)
            x += (e - s) + gap
        return cls(groups, offsets, gap)

    def group(self, t: float) -> int:
        return max((i for i, (s, _) in enumerate(self.groups) if s <= t), default=0)

    def x(self, t: float, group: int) -> float:
        return self.offsets[group] + (t - self.groups[group][0])

    @property
    def width(self) -> float:
        return self.offsets[-1] + self.groups[-1][1] - self.groups[-1][0]

    def ticks(self) -> tuple[list[float], list[str]]:
        from matplotlib.ticker import MaxNLocator

        pos: list[float] = []
        labels: list[str] = []
        for i, (s, e) in enumerate(self.groups):
            n = max(1, round(8 * (e - s) / max(self.width, 1e-9)))
            values = [v for v in MaxNLocator(nbins=n).tick_values(s, e) if s <= v <= e]
            if i > 0 or not values:
                values = [s] + [v for v in values if v - s > 0.25 * (e - s)]
            for v in values:
                pos.append(self.x(v, i))
                labels.append(f"{v:.0f}" if abs(v) >= 10 or v == round(v) else f"{v:.1f}")
        return pos, labels


def plot_waterfall(report: Report, trace_id: str, path: Path) -> Path:
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    steps = sorted((s for s in report.steps if s.trace_id == trace_id), key=lambda s: (s.start_ns, s.span_id))
    total = len(steps)
    steps = steps[:MAX_WATERFALL_STEPS]
    step_keys = {s.span_id: i for i, s in enumerate(steps)}
    hops_of: dict[int, list[tuple[Pair, Span]]] = defaultdict(list)
    for h in report.hops:
        if h.trace_id == trace_id and h.parent_id in step_keys:
            hops_of[step_keys[h.parent_id]].append((hop_pair(h), h))
    pairs = sorted({p for hs in hops_of.values() for p, _ in hs}, key=Pair.sort_key)
    short, node = _short_names([c for p in pairs for c in (p.src, p.dst)])
    cmap = colormaps["tab10" if len(pairs) <= 10 else "tab20"]
    color = {p: cmap(i % cmap.N) for i, p in enumerate(pairs)}
    lane = {p: i for i, p in enumerate(pairs)}
    t0 = steps[0].start_ns

    def ms(ns: int) -> float:
        return (ns - t0) / 1e6

    extents = [(min([ms(s.start_ns)] + [ms(h.start_ns) for _, h in hops_of.get(i, [])]),
                max([ms(s.end_ns)] + [ms(h.end_ns) for _, h in hops_of.get(i, [])]))
               for i, s in enumerate(steps)]
    axis = TimeAxis.of(extents)
    fig = Figure(figsize=(11, max(3.0, 0.42 * len(steps) + 1.8)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    k = max(1, len(pairs))
    for row, s in enumerate(steps):
        g = axis.group(extents[row][0])
        ax.broken_barh([(axis.x(ms(s.start_ns), g), (s.end_ns - s.start_ns) / 1e6)], (row - 0.42, 0.84),
                       facecolors="#dddddd", edgecolors="#888888", linewidth=0.6)
        for pair, h in hops_of.get(row, []):  # each pair its own thin lane inside the step's row
            y = row - 0.38 + 0.76 * lane[pair] / k
            width = max((h.end_ns - h.start_ns) / 1e6, 1e-4)
            ax.broken_barh([(axis.x(ms(h.start_ns), g), width)], (y, 0.76 / k), facecolors=[color[pair]])
    for i in range(1, len(axis.groups)):  # the shortened idle gaps, hatched, with their true length
        left = axis.offsets[i] - axis.gap
        ax.axvspan(left, axis.offsets[i], facecolor="none", edgecolor="#bbbbbb", hatch="//", linewidth=0)
        idle = axis.groups[i][0] - axis.groups[i - 1][1]
        ax.text(left + axis.gap / 2, -0.5, f"+{idle:.0f} ms", ha="center", va="bottom", fontsize=7,
                color="#666666", clip_on=False)
    labels = [("prefill" if s.name == "fastmode.prefill" else "decode")
              + f" {s.attributes.get('fastmode.step', '')}".rstrip() for s in steps]
    ax.set_yticks(range(len(steps)), labels)
    ax.set_ylim(len(steps) - 0.5, -0.5)
    ax.set_xticks(*axis.ticks())
    ax.set_xlim(-0.01 * axis.width, 1.01 * axis.width)
    broken = " (hatched: idle time between sampled steps, shortened)" if len(axis.groups) > 1 else ""
    ax.set_xlabel("ms from the first step's start" + broken)
    ax.grid(axis="x", alpha=0.3)
    lay = steps[0].attributes
    shown = f"{total} steps" if total == len(steps) else f"first {len(steps)} of {total} steps"
    ax.set_title(f"trace {trace_id} · {shown} · tp{lay.get('fastmode.tp', '?')} x "
                 f"pp{lay.get('fastmode.pp', '?')} {lay.get('fastmode.transport', '')}"
                 + (f" · node {node}" if node else ""), fontsize=9, pad=14)
    handles = [Patch(color="#dddddd", label="step span")]
    handles += [Patch(color=color[p], label=f"{short.get(p.src, p.src)} -> {short.get(p.dst, p.dst)}")
                for p in pairs]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


# ---------------------------------------------------------------------------------------------- CLI


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fastmode trace",
                                description="Per-hop cost table, chip-to-chip heatmap and step waterfall of "
                                "the fast lane, from spans exported as OTLP JSON (FASTMODE_TRACE_FILE, or an "
                                "OpenTelemetry Collector's file exporter).")
    p.add_argument("file", help="OTLP JSON: one ExportTraceServiceRequest per line, one such document, "
                   "or an array of them")
    p.add_argument("--out", default=None, help="folder for heatmap.png and waterfall.png "
                   "(default: <FILE stem>_report/ next to FILE)")
    p.add_argument("--trace-id", default=None, help="trace for the waterfall: hex (or a unique prefix) or "
                   "base64 (default: the trace with the most step spans)")
    p.add_argument("--json", action="store_true", help="print the table as one JSON object instead")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Read, analyse, plot; the JSON result (the table and where the pictures went)."""
    path = Path(args.file)
    report = analyze(load_spans(path))
    if not report.hops:
        raise TraceReportError(f"no hop spans found in {path} ({len(report.steps)} step spans): "
                               "the chips' hops are traced by the fast lane only")
    trace_id = choose_trace(report, args.trace_id) if (report.steps or args.trace_id) else None
    out = Path(args.out) if args.out else path.parent / f"{path.stem}_report"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TraceReportError(f"cannot create {out}: {e.strerror or e}") from None
    heatmap = plot_heatmap(report, out / "heatmap.png")
    waterfall = plot_waterfall(report, trace_id, out / "waterfall.png") if trace_id else None
    return {"file": str(path), **report.summary(), "pairs": report.rows, "waterfall_trace_id": trace_id,
            "heatmap": str(heatmap), "waterfall": str(waterfall) if waterfall else None,
            "table": format_table(report)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        result = run(args)
    except TraceReportError as e:
        print(f"fastmode trace: {e}", file=sys.stderr)
        return 1
    table = result.pop("table")
    if args.json:
        print(json.dumps(result, default=str))
    else:
        print(table)
        print()
        print(f"heatmap:   {result['heatmap']}")
        if result["waterfall"]:
            print(f"waterfall: {result['waterfall']} (trace {result['waterfall_trace_id']})")
        else:
            print("waterfall: none (no step spans)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
