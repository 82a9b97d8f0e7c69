"""``bench.packed_rows``: the kernel built without a row limit against MKL, on the shipped models'
linears; its results are the kernel's own products (checked against ``F.linear`` per row count)."""

from __future__ import annotations

import json

import pytest

from bench import packed_rows
from sharding import packed


@pytest.mark.slow
@pytest.mark.skipif(packed.unavailable_reason() is not None, reason=str(packed.unavailable_reason()))
def test_each_row_count_is_timed_on_both(tmp_path):
    out = tmp_path / "rows.json"
    assert packed_rows.main(["--rows", "1,20,80", "--passes", "2", "--json", out]) == 0
    doc = json.loads(out.read_text())
    assert [r["rows"] for r in doc["results"]] == [1, 20, 80] and doc["threads"] == 1
    for r in doc["results"]:
        assert r["kernel_ms"] > 0 and r["mkl_ms"] > 0
        assert r["kernel_over_mkl"] == pytest.approx(r["kernel_ms"] / r["mkl_ms"])
