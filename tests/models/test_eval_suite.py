"""Quality eval v2 end to end on the tiny test pair: every task set, the scores' arithmetic, the
paired comparison and agreement (the models are tiny: what is checked is the eval, not them)."""

from __future__ import annotations

import json

from models.eval import suite
from models.eval.backend import Request, TransformersBackend, join_messages
from models.eval.run import cut_vocabularies, main
from models.eval.stats import wilson


def test_v2_on_the_tiny_pair(tiny_models, tmp_path):
    out = tmp_path / "v2.json"
    rc = main(["--suite", "v2", "--model", str(tiny_models / "full"), "--model", str(tiny_models / "fast"),
               "--humaneval", "2", "--next-line", "4", "--tasks", "9", "--max-files", "3",
               "--max-prefix-chars", "200", "--batch-size", "4", "--json", str(out)])
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["counts"] == {"humaneval": 2, "next_line": 4, "tasks": 9} and r["samples"] == 15
    assert set(r["training_data"]) == {"humaneval", "next_line", "tasks"}
    full, fast = r["models"]
    for m in r["models"] + [r["baseline"]]:
        assert sum(t["hits"] for t in m["tasks"].values()) == m["all"]["hits"]
        assert sum(k["samples"] for k in m["kinds"].values()) == m["tasks"]["tasks"]["samples"] == 9
        assert m["all"]["ci95"] == list(wilson(m["all"]["hits"], 15))
    key = f"{fast['name']} vs {full['name']}"
    c = r["vs_first"][key]["all"]
    assert c["difference"] == (fast["all"]["hits"] - full["all"]["hits"]) / 15
    assert 0 <= c["mcnemar_exact_p"] <= 1 and 0 <= r["agreement"][key]["all"] <= 1
    assert r["baseline"]["tasks"]["humaneval"]["hits"] == 0  # `pass` solves none


def test_one_model_against_itself_agrees_everywhere(tiny_models):
    b = TransformersBackend(tiny_models / "full", batch_size=3)
    items = suite.build({"next_line": 3, "tasks": 4}, seed=1, held=suite.held_out_files(2), max_prefix_chars=150)
    r = suite.evaluate([b, b], items, per_sample=True)
    key = f"{b.name} vs {b.name}"
    assert r["agreement"][key]["all"] == 1.0 and r["vs_first"][key]["all"]["mcnemar_exact_p"] == 1.0
    for s in r["per_sample"]:
        hit = s["hits"][b.name]
        item = next(it for it in items if it.id == s["id"])
        assert hit == item.grade(s["outputs"][b.name])


def test_generate_batched_matches_one_at_a_time(tiny_models):
    b = TransformersBackend(tiny_models / "full", batch_size=4)
    reqs = [Request("def f(x):\n", 6, ("\n",)), Request("import os\nimport", 5),
            Request(({"role": "user", "content": "What is 2 + 3?"},), 4), Request("x = 1\n", 6, ("\n",))]
    batched = b.generate(reqs)
    single = [b.generate([r])[0] for r in reqs]
    assert batched == single
    assert all("\n" not in out for out, r in zip(batched, reqs) if r.stop)
    assert b.render(reqs[2].prompt) == b.tokenizer(join_messages(reqs[2].prompt)).input_ids  # no template


def test_next_line_prompts_end_at_the_tokenizers_boundary():
    assert suite.indent_hint("        return 0") == "       "
    assert suite.indent_hint("import os") == ""
    items = suite.build({"next_line": 20}, seed=0, held=suite.held_out_files(3))
    for it in items:
        hint = suite.indent_hint(it.reference)
        assert it.request.prompt.endswith("\n" + hint) and it.grade(it.reference[len(hint):])
        assert not it.grade(it.reference)  or not hint


def test_vocab_adds_each_model_with_token_counts_cut_to_its_most_frequent_tokens(tiny_models, tmp_path):
    import shutil

    fast = shutil.copytree(tiny_models / "fast", tmp_path / "fast")
    (fast / "token_counts.json").write_text(json.dumps({"tokens": 5, "counts": [[300, 3], [301, 1], [302, 1]]}))
    out = tmp_path / "v2.json"
    rc = main(["--suite", "v2", "--model", str(tiny_models / "full"), "--model", str(fast), "--vocab", "32",
               "--humaneval", "0", "--next-line", "3", "--tasks", "0", "--max-files", "2",
               "--max-prefix-chars", "150", "--batch-size", "3", "--json", str(out)])
    assert rc == 0
    names = [m["name"] for m in json.loads(out.read_text())["models"]]
    assert names == ["full", "fast", "fast (vocab 32)"]
    (path, keep), = cut_vocabularies([tiny_models / "full", fast], 32)  # the full model has no counts
    assert path == fast and len(keep) == 32 and {300, 301, 302} <= set(keep)
    plain, cut = TransformersBackend(fast), TransformersBackend(fast, keep=keep)
    assert len(cut.suppress) == cut.model.config.vocab_size - 32 and not set(cut.suppress) & set(keep)
    reqs = [Request("def f(x):\n", 6), Request("import os\nimport", 5), Request("x = 1\n", 6)]
    assert cut.generate(reqs) != plain.generate(reqs)


def test_vocab_keeps_each_requests_prompt_tokens_as_the_lane_does(tiny_models):
    """``keep_prompt`` (the eval's default for ``--vocab``, as the lane's ``vocab_keeps_prompt``):
    batched, each request's output is transformers' ``suppress_tokens`` run alone with its own
    prompt's ids added to the kept ones."""
    fast = tiny_models / "fast"
    keep = list(range(32))
    reqs = [Request("def f(x):\n", 6), Request("import os\nimport", 5), Request("x = 1\n", 6)]
    batched = TransformersBackend(fast, keep=keep, keep_prompt=True)
    got = batched.generate(reqs)
    alone = [TransformersBackend(fast, keep=sorted(set(keep) | set(batched.render(r.prompt)))).generate([r])[0]
             for r in reqs]
    assert got == alone
    assert got != TransformersBackend(fast, keep=keep).generate(reqs)  # the prompts' tokens matter
