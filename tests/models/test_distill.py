"""``fastmode distill``: shape, the full model's answers, the student's loss, the folder and its assembly.

References: transformers' own greedy ``generate`` and forward logits of the full model (the test
pair's full model, small enough for seconds), and transformers loading the assembled checkpoint.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from models import TEST_FAST, TEST_FULL
from models.builtin import ModelPathError, resolve
from models.distill import layers, shape, student, teacher, train
from models.distill.assemble import DistilledError, assemble
from models.distill.config import PRESETS, DistillConfig
from models.distill.run import main

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def full():
    return AutoModelForCausalLM.from_pretrained(TEST_FULL, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TEST_FULL)


@pytest.fixture(scope="module")
def distilled(tmp_path_factory):
    """The quick preset run twice, in two work folders: (out, manifest, out2)."""
    root = tmp_path_factory.mktemp("distill")
    args = ["--full", str(TEST_FULL), "--preset", "quick", "--threads", "1"]
    assert main([*args, "--out", str(root / "a" / "fast")]) == 0
    assert main([*args, "--out", str(root / "b" / "fast")]) == 0
    out = root / "a" / "fast"
    return out, json.loads((out / "distilled.json").read_text()), root / "b" / "fast"


def test_spaced_keeps_first_and_last():
    assert shape.spaced(30, 8) == (0, 4, 8, 12, 17, 21, 25, 29)
    assert shape.spaced(8, 2) == (0, 7)
    assert shape.spaced(5, 1) == (0,)
    with pytest.raises(shape.ShapeError):
        shape.spaced(4, 5)


def test_choose_keeps_the_most_layers_that_reach_the_speedup():
    config = json.loads((TEST_FULL / "config.json").read_text())
    chosen = shape.choose(config, speedup=2.0, chips=2, device="cpu")
    assert chosen.predicted_speedup >= 2.0
    if chosen.num_layers + 1 < config["num_hidden_layers"]:
        more = shape.choose(config, speedup=2.0, chips=2, device="cpu", num_layers=chosen.num_layers + 1)
        assert more.predicted_speedup < 2.0
    with pytest.raises(shape.ShapeError, match="lower --speedup"):
        shape.choose(config, speedup=1000.0, chips=2, device="cpu")


def test_measured_layers_drop_the_one_whose_student_loses_least(full, tokenizer):
    """One round of the search against students built separately (``student.build``, transformers'
    own model from a config with fewer layers): it drops the layer whose student scores the lowest
    loss, scores it as that student does, and leaves the full model as it was."""
    rows = teacher.answer(full, tokenizer, ["def add(a, b):\n", "import os\n\nclass Path"], max_new_tokens=8,
                          top_k=4)
    batch = train.collate(rows, pad=2)
    total = full.config.num_hidden_layers
    with torch.no_grad():
        before = full(input_ids=batch["ids"]).logits
        alone = {j: float(train.loss_of(student.build(full, tuple(k for k in range(total) if k != j)), batch, 0.1)[0])
                 for j in range(total)}
    keep, rounds = layers.measured(full, rows, total - 1, pad=2, ce_weight=0.1)
    best = min(alone, key=alone.get)
    assert keep == tuple(k for k in range(total) if k != best)
    assert rounds == [{"dropped": [best], "kept": total - 1, "loss": pytest.approx(alone[best], abs=1e-4)}]
    with torch.no_grad():
        torch.testing.assert_close(full(input_ids=batch["ids"]).logits, before)
    assert full.config.num_hidden_layers == total and len(full.model.layers) == total
    # several rounds, fewer layers each, down to the count asked for
    keep, rounds = layers.measured(full, rows, 2, pad=2, ce_weight=0.1)
    assert len(keep) == 2 and list(keep) == sorted(keep)
    assert [r["kept"] for r in rounds] == sorted((r["kept"] for r in rounds), reverse=True) and rounds[-1]["kept"] == 2
    assert [layers.per_round(30, 8), layers.per_round(10, 8), layers.per_round(9, 8)] == [5, 1, 1]


def test_answers_are_transformers_greedy_with_its_top_k(full, tokenizer):
    prompts = ["def add(a, b):\n", "import os\n\nclass Path"]
    rows = teacher.answer(full, tokenizer, prompts, max_new_tokens=10, top_k=5)  # batched, left-padded
    for prompt, row in zip(prompts, rows):
        ids = torch.tensor([teacher.prompt_ids(tokenizer, prompt)])
        alone = full.generate(input_ids=ids, max_new_tokens=10, do_sample=False)[0].tolist()
        assert row["ids"] == alone[: len(row["ids"])]
        with torch.no_grad():
            logits = full(input_ids=torch.tensor([row["ids"]])).logits[0].float()
        logp = torch.log_softmax(logits[row["prompt_len"] - 1 : len(row["ids"]) - 1], -1)
        want = logp.topk(5, -1)
        assert torch.equal(row["topk_ids"].long(), want.indices)
        torch.testing.assert_close(row["topk_logp"], want.values, atol=1e-4, rtol=0)


def test_student_starts_from_the_kept_layers_and_scores_answer_positions(full, tokenizer):
    keep = (0, 3, 7)
    pupil = student.build(full, keep)
    names = student.shared_names(pupil)
    assert names == ["model.embed_tokens.weight", "lm_head.weight"]  # the test pair's head is untied
    for new, old in enumerate(keep):
        torch.testing.assert_close(pupil.model.layers[new].mlp.down_proj.weight, full.model.layers[old].mlp.down_proj.weight)
    assert not any(p.requires_grad for n, p in pupil.named_parameters() if n in names)
    # the loss scores exactly the answer tokens: its positions' logits are the student's own forward
    row = teacher.answer(full, tokenizer, ["def f(x):\n"], max_new_tokens=6, top_k=4)[0]
    batch = train.collate([row], pad=2)
    logq = student.answer_logits(pupil, batch["ids"], batch["positions"])
    with torch.no_grad():
        ref = torch.log_softmax(pupil(input_ids=torch.tensor([row["ids"][:-1]])).logits[0].float(), -1)
    torch.testing.assert_close(logq, ref[row["prompt_len"] - 1 :], atol=1e-4, rtol=0)
    assert torch.equal(batch["greedy"], torch.tensor(row["ids"][row["prompt_len"]:]))


def test_the_student_folder_assembles_into_a_checkpoint_transformers_loads(distilled, full):
    out, manifest, _ = distilled
    assert {p.name for p in out.iterdir()} >= {"config.json", "student.safetensors", "distilled.json", "README.md"}
    own = load_file(str(out / "student.safetensors"))
    assert not any("embed_tokens" in n or n.startswith("lm_head") for n in own)  # shipped without them
    path = assemble(out, TEST_FULL)
    assert resolve(out, full=TEST_FULL) == path
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert model.config.num_hidden_layers == len(manifest["keep"])
    torch.testing.assert_close(model.model.embed_tokens.weight, full.model.embed_tokens.weight)
    for name, tensor in own.items():
        torch.testing.assert_close(model.state_dict()[name], tensor.float())
    assert AutoTokenizer.from_pretrained(path).get_vocab() == AutoTokenizer.from_pretrained(TEST_FULL).get_vocab()
    text = (out / "README.md").read_text()
    assert f"{manifest['train']['steps']} steps" in text and manifest["run"]["machine"] in text


def test_the_student_carries_its_answers_token_counts_which_recount_makes_again(distilled, tmp_path):
    """``token_counts.json``: every answer token of the run, most frequent first; the assembled
    checkpoint carries it; ``models.distill.counts`` makes the same file again from the student's
    own settings (the full model's greedy answers, batched as the run batched them)."""
    import shutil

    from models.distill.counts import recount

    out, manifest, _ = distilled
    counts = json.loads((out / "token_counts.json").read_text())
    ns = [n for _, n in counts["counts"]]
    assert counts["tokens"] == manifest["data"]["answer_tokens"] == sum(ns) and ns == sorted(ns, reverse=True)
    assert (assemble(out, TEST_FULL) / "token_counts.json").read_bytes() == (out / "token_counts.json").read_bytes()
    copy = shutil.copytree(out, tmp_path / "student")
    (copy / "token_counts.json").unlink()
    recount(copy, TEST_FULL, threads=1, log=lambda *_: None)
    assert (copy / "token_counts.json").read_bytes() == (out / "token_counts.json").read_bytes()


def test_same_settings_and_seed_make_the_same_student(distilled):
    out, _, again = distilled
    assert (out / "student.safetensors").read_bytes() == (again / "student.safetensors").read_bytes()


def test_a_rerun_resumes_from_its_work_folder(tmp_path):
    out = tmp_path / "fast"
    args = ["--full", str(TEST_FULL), "--preset", "quick", "--threads", "1", "--out", str(out)]
    assert main(args) == 0
    work = tmp_path / ".fast.work"
    [answers] = work.glob("answers-*")
    shards = {p: p.stat().st_mtime_ns for p in answers.glob("prompts-*.pt")}
    [student] = work.glob("student-*")
    saved = torch.load(student / "student.pt", weights_only=False)["state"]
    assert saved["step"] == PRESETS["quick"].steps
    assert main(args) == 0  # nothing left to do: the answers and the student are reused
    assert {p: p.stat().st_mtime_ns for p in answers.glob("prompts-*.pt")} == shards
    assert json.loads((out / "distilled.json").read_text())["train"]["steps"] == PRESETS["quick"].steps
    # training longer reuses the full model's answers, in a student folder of its own
    assert main([*args, "--steps", str(PRESETS["quick"].steps + 2)]) == 0
    assert {p: p.stat().st_mtime_ns for p in answers.glob("prompts-*.pt")} == shards
    assert len(list(work.glob("student-*"))) == 2
    assert json.loads((out / "distilled.json").read_text())["train"]["steps"] == PRESETS["quick"].steps + 2


def test_measured_layers_are_searched_once_and_written_into_the_card(tmp_path):
    out = tmp_path / "fast"
    args = ["--full", str(TEST_FULL), "--preset", "quick", "--threads", "1", "--out", str(out), "--layers", "measured",
            "--num-layers", "3"]
    assert main(args) == 0
    manifest = json.loads((out / "distilled.json").read_text())
    [saved] = (tmp_path / ".fast.work").glob("answers-*/layers-measured-*.json")
    found = json.loads(saved.read_text())
    assert manifest["keep"] == found["keep"] and len(found["keep"]) == 3 and manifest["layer_search"] == found["rounds"]
    assert "Its layers were measured" in (out / "README.md").read_text()
    saved.write_text(json.dumps({"keep": [0, 1, 2], "rounds": found["rounds"]}))  # a resumed run reads it back
    assert main(args) == 0
    assert json.loads((out / "distilled.json").read_text())["keep"] == [0, 1, 2]


def test_a_student_needs_its_own_full_model(distilled):
    out, _, _ = distilled
    with pytest.raises(DistilledError, match="other tensors|other weights"):
        assemble(out, TEST_FAST)
    with pytest.raises(ModelPathError, match="served with the full model"):
        resolve(out)


def test_the_shipped_preset_is_the_shipped_students_settings():
    """``fastmode distill --full builtin:smollm2-135m-instruct --out DIR`` (the ``shipped`` preset) runs
    with the settings ``models/fast`` was made with, as its manifest records them."""
    from models import DEFAULT_FAST

    manifest = json.loads((DEFAULT_FAST / "distilled.json").read_text())
    assert manifest["settings"] == PRESETS["shipped"].to_dict()
    assert manifest["full"]["name"] == "builtin:smollm2-135m-instruct"


def test_a_wanted_speedup_lets_the_planner_pick_the_layer_count(monkeypatch, tmp_path):
    """The shipped preset sets 12 layers; ``--speedup`` alone asks the planner instead (never ignored)."""
    from models.distill import run

    got = []
    monkeypatch.setattr(run, "distill", lambda full, out, cfg, **kw: got.append(cfg))
    base = ["--full", str(TEST_FULL), "--out", str(tmp_path / "s")]
    assert main(base) == 0 and main([*base, "--speedup", "3"]) == 0
    assert main([*base, "--speedup", "3", "--num-layers", "2"]) == 0
    assert [(c.num_layers, c.speedup) for c in got] == [(12, 2.5), (None, 3.0), (2, 3.0)]


def test_bad_settings_are_refused(capsys):
    with pytest.raises(ValueError, match="speedup"):
        DistillConfig(speedup=1.0)
    with pytest.raises(ValueError, match="layers must be spaced or measured"):
        DistillConfig(layers="random")
    assert main(["--full", "builtin:nope", "--out", "/tmp/x"]) == 2
    assert "no built-in model 'nope'" in capsys.readouterr().err


def test_prompt_set_1_is_pinned_and_set_2_adds_questions_answered_from_their_text():
    import hashlib

    from models.distill.prompts import prompt_set

    one = prompt_set(768, 1234)
    # Set 1 made the first shipped student (decision 027's, in the history): a changed set 1 could no
    # longer reproduce it, nor any student a user distilled on the default set.
    assert hashlib.sha256(json.dumps(one).encode()).hexdigest()[:16] == "d5a171a2155bc3ca"
    assert all(isinstance(p, str) for p in one)
    two = prompt_set(400, 1234, version=2)
    assert two == prompt_set(400, 1234, version=2) and len(set(two)) == 400
    shots = [p for p in two if not isinstance(p, str)]
    assert shots and all(p[-1][0] == "user" and [r for r, _ in p] == ["user", "assistant", "user"] for p in shots)
    copies = [p for p in two if isinstance(p, str) and "\n" in p and not p.startswith("Continue")]
    assert len(copies) > 20  # a sentence (or a list), then the question about it
    with pytest.raises(ValueError, match="prompt_set"):
        prompt_set(4, 0, version=3)
    with pytest.raises(ValueError, match="prompt_set"):
        DistillConfig(prompt_set=0)


def test_a_worked_example_prompt_is_rendered_by_the_chat_template(tmp_path, tokenizer):
    from tests.serve.chat_models import with_template

    templated = AutoTokenizer.from_pretrained(with_template(TEST_FULL, tmp_path / "chat"))
    prompt = (("user", "Convert 2 m to cm."), ("assistant", "200 cm"), ("user", "Convert 5 m to cm."))
    messages = [{"role": r, "content": c} for r, c in prompt]
    assert teacher.prompt_ids(templated, prompt) == templated.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert teacher.prompt_ids(templated, "hi") == templated.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True, return_dict=False)
    # without a template: the contents joined by newlines
    assert teacher.prompt_ids(tokenizer, prompt) == tokenizer("Convert 2 m to cm.\n200 cm\nConvert 5 m to cm.")["input_ids"]
