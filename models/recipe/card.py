"""``models/test/README.md``: the test pair's cards, written by the recipe from what it measured."""

from __future__ import annotations

from pathlib import Path

HEADER = """# The test pair

Two small standard Hugging Face Llama checkpoints (the test suite's pair) that transformers, vLLM and fastmode's own executor
all load from the same files. Written by `{command}` ({minutes:.0f} min wall on {device});
every figure below was measured by that run and is also in each model's `training.json`.

Both share one byte-level BPE tokenizer ({vocab} entries incl. `<|bos|>`=0, `<|eos|>`=1,
`<|pad|>`=2), trained on the first {tok_mb:.0f} MB of the training files. The tokenizer prepends
`<|bos|>`; decoding is byte-exact.

## Corpus
- The `*.py` files of the running interpreter's standard library (`{stdlib}`, Python {python}),
  excluding `site-packages` and test directories (`test`, `tests`, `idle_test`):
  {corpus_files} files, sha256 `{corpus_sha256}` (over sorted paths and contents,
  `models/recipe/corpus.py:corpus_hash`).
- Held out: {held_out_rule} ({held_out_files} files, {held_out_tokens:,} tokens); never trained on.
- Training: {train_files} files, {train_tokens:,} tokens.

## Cards
| | full | fast |
|---|---|---|
"""

ROWS = [
    ("architecture", lambda s: "LlamaForCausalLM"),
    ("parameters", lambda s: f"{s['parameters']:,}"),
    ("layers x hidden", lambda s: f"{s['config']['num_hidden_layers']} x {s['config']['hidden_size']}"),
    ("heads (q / kv)", lambda s: f"{s['config']['num_attention_heads']} / {s['config']['num_key_value_heads']}"),
    ("MLP width (SwiGLU)", lambda s: str(s['config']['intermediate_size'])),
    ("tied embeddings", lambda s: str(s['config']['tie_word_embeddings'])),
    ("context", lambda s: str(s['config']['max_position_embeddings'])),
    ("storage", lambda s: "bf16 safetensors"),
    ("objective", lambda s: s["objective"]),
    ("seed", lambda s: str(s["seed"])),
    ("steps x batch x seq", lambda s: (f"{s['steps']} x {s['recipe']['pretrain' if s['name'] == 'full' else 'distill']['batch_size']}"
                                      f" x {s['recipe']['pretrain' if s['name'] == 'full' else 'distill']['seq_len']}")),
    ("tokens seen", lambda s: f"{s['tokens_seen']:,}"),
    ("training time", lambda s: f"{s['train_seconds'] / 60:.1f} min"),
    ("final train loss (nats/token)", lambda s: str(s["final_train_loss"])),
    ("final held-out loss (nats/token)", lambda s: str(s["final_held_out_loss"])),
]

FOOTER = """
Final losses are next-token cross-entropy of the shipped bf16 weights run in fp32, on 64 fixed
windows of {seq} tokens from the start of the training and held-out streams.

## Reproduce
```
make models            # = .venv/bin/python -m models.recipe --recipe shipped
```
Resumable: state lives in `models/test/.work/shipped/`; rerun the same command after an interruption.
On a CUDA machine the same command trains on the GPU. bf16 autocast is used where the hardware
supports it (`FASTMODE_RECIPE_FP32=1` turns it off); results differ in the last digits from run
to run on other hardware.
"""


def write_readme(out_dir: Path, stats: dict, wall_seconds: float) -> None:
    full, fast = stats["full"], stats["fast"]
    recipe = full["recipe"]
    text = HEADER.format(
        command=f"python -m models.recipe --recipe {recipe['name']}", minutes=wall_seconds / 60,
        device=full["device"], vocab=recipe["vocab_size"], tok_mb=recipe["tokenizer_sample_bytes"] / 1e6,
        **{k: full[k] for k in ("stdlib", "python", "corpus_files", "corpus_sha256", "held_out_rule",
                                "held_out_files", "held_out_tokens", "train_files", "train_tokens")},
    )
    for label, fn in ROWS:
        text += f"| {label} | {fn(full)} | {fn(fast)} |\n"
    text += FOOTER.format(seq=recipe["pretrain"]["seq_len"])
    (out_dir / "README.md").write_text(text)
