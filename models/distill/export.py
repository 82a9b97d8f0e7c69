"""The student on disk: only what differs from the full model, and its card.

A student folder holds ``config.json`` and ``generation_config.json`` (a standard checkpoint's),
``student.safetensors`` (the trained layers and final norm, bf16), ``distilled.json`` (which tensors
come from which full model, identified by the sha256 of those tensors' bytes, and every setting and
figure of the run), ``token_counts.json`` (the tokens of the full model's answers it was trained on,
most frequent first: the exact lane's pruned draft head keeps the top of it, ``sharding.draft_vocab``)
and ``README.md`` (the model card). The embedding (and the tokenizer) are the full
model's, so the folder is a few tens of megabytes lighter; ``assemble`` rebuilds the whole
checkpoint from it and the full model.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

FORMAT = 1
MANIFEST = "distilled.json"
WEIGHTS = "student.safetensors"


def tensors_sha256(checkpoint: Path, names: list[str]) -> str:
    """sha256 over ``names``' tensors of the checkpoint at ``checkpoint`` (name, dtype, shape, bytes):
    the same for the same values whatever the file's layout or metadata."""
    digest = hashlib.sha256()
    found = {}
    for file in sorted(Path(checkpoint).glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            for name in names:
                if name in f.keys():
                    found[name] = f.get_tensor(name)
    for name in names:
        if name not in found:
            raise KeyError(f"{checkpoint}: no tensor {name!r}")
        t = found[name].contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def write(student, out: Path, *, full_dir: Path, shared: list[str], manifest: dict, card: str,
          token_counts: dict | None = None) -> Path:
    """Write ``student`` (its trained tensors; ``shared`` ones stay the full model's) into ``out``;
    ``token_counts``: ``sharding.draft_vocab.count_tokens`` of the answers it learned."""
    out.mkdir(parents=True, exist_ok=True)
    if token_counts is not None:
        write_token_counts(out, token_counts)
    trained = {n: t.detach().to(torch.bfloat16).contiguous() for n, t in student.state_dict().items()
               if n not in shared and not (n == "lm_head.weight" and student.config.tie_word_embeddings)}
    save_file(trained, str(out / WEIGHTS), metadata={"format": "pt"})
    config = student.config.to_dict()
    config["dtype"] = "bfloat16"
    config.pop("torch_dtype", None)
    config["architectures"] = [type(student).__name__]
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    gen = Path(full_dir) / "generation_config.json"
    if gen.is_file():
        (out / "generation_config.json").write_text(gen.read_text())
    manifest = {"format": FORMAT, **manifest,
                "shared": {"names": shared, "sha256": tensors_sha256(full_dir, shared)},
                "student_sha256": hashlib.sha256((out / WEIGHTS).read_bytes()).hexdigest()}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    (out / "README.md").write_text(card)
    return out


def write_token_counts(out: Path, counts: dict) -> Path:
    """``counts`` as ``out/token_counts.json`` (``sharding.draft_vocab.TOKEN_COUNTS``), one id per line."""
    from sharding.draft_vocab import TOKEN_COUNTS

    path = Path(out) / TOKEN_COUNTS
    lines = ",\n".join(f"  [{t}, {n}]" for t, n in counts["counts"])
    path.write_text(f'{{"tokens": {counts["tokens"]}, "counts": [\n{lines}\n]}}\n')
    return path
