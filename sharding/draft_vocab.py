"""A small model's head cut to its most frequent tokens: a draft's (the same output) or the fast lane's.

Each draft step of a speculative round ends in the draft model's head, ``[V, D]``; on a small draft
with a large vocabulary that head is a large share of the step (SmolLM2's 49,152 x 576 is half of the
shipped student's weights). ``prune_head(model, keep)`` replaces the head by its rows ``keep``, the
token ids the draft may propose, so a draft step multiplies by ``len(keep)`` rows instead of ``V``
(frequency-ranked drafting: FR-Spec, Zhao et al., 2025).

The target still verifies every draft against its whole vocabulary, so the output does not change.
Greedy: a draft is kept only when it is the target's argmax. Sampled: the rejection rule yields the
target's distribution for any draft distribution ``q``; here ``q`` is zero outside ``keep``
(``expand``: the draft's logits there are ``-inf``), and the residual ``max(p - q, 0)`` holds
those tokens. Only acceptance can fall: where the target's next token is outside ``keep``, the
draft cannot propose it.

The fast lane may cut its model's head the same way (``lanes.fast.vocab``; ``StageRunner``'s
``vocab``). There nothing verifies: the lane produces only the kept ids (every other one's logit
is ``-inf``, whatever the sampling parameters), a cut of the fast model's output that the quality
eval measures, for a step that streams ``len(keep)`` rows of the head instead of ``V``.

Which ids: the most frequent tokens in the full model's own answers, as ``fastmode distill``
counts them in the answers its student is trained on and writes beside the student
(``TOKEN_COUNTS``: ``{"tokens": N, "counts": [[id, count], ...]}``, most frequent first).
``keep_ids`` takes the first ``size`` of them, adds the model's end-of-turn ids (so a draft can
propose the end), and rounds up to whole 16-row blocks (the packed kernel's, ``sharding.packed``)
with the next-ranked ids.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from .errors import InvalidLayout

TOKEN_COUNTS = "token_counts.json"
"""The file, in a draft model's folder, of its token ids ranked by frequency."""

BLOCK = 16
"""``keep`` is a whole number of these rows (``sharding.packed.BLOCK``)."""


AUTO_SIZE = 4096
"""``draft_vocab: auto``'s size, where the draft has token counts and a vocabulary at least twice as large."""


def resolve(setting: int | str | None, folder: str | Path, vocab_size: int,
            auto_size: int = AUTO_SIZE) -> int | None:
    """A config's ``draft_vocab`` (or fast lane's ``vocab``) as a size (``None``: the whole
    vocabulary). ``"auto"``: ``auto_size`` where ``folder`` has ``TOKEN_COUNTS`` and the vocabulary
    is at least twice that, else the whole vocabulary; a number: that size."""
    if setting == "auto":
        return auto_size if (Path(folder) / TOKEN_COUNTS).is_file() and vocab_size >= 2 * auto_size else None
    return setting


def vocab_ids(setting: int | str | None, folder: str | Path, vocab_size: int, eos_token_ids: Iterable[int],
              auto_size: int = AUTO_SIZE) -> list[int] | None:
    """A config's cut vocabulary as the ids a head keeps (``keep_ids``: the model's end ids, then its
    most frequent tokens in ``folder``'s ``TOKEN_COUNTS``), or ``None`` for the whole vocabulary
    (``setting`` as ``resolve`` reads it).

    Raises:
        DraftVocabUnavailable: a size was set and ``folder`` has no usable token counts.
        InvalidLayout: the size is not positive.
    """
    size = resolve(setting, folder, vocab_size, auto_size)
    if size is None:
        return None
    return keep_ids(ranked_ids(folder), size, vocab_size, always=eos_token_ids).tolist()


class DraftVocabUnavailable(InvalidLayout):
    """A pruned draft head was asked for and the draft's folder has no usable token counts."""

    code = "draft_vocab_unavailable"


def ranked_ids(folder: str | Path) -> list[int]:
    """The draft's token ids, most frequent first, from ``folder/token_counts.json``.

    Raises:
        DraftVocabUnavailable: the file is missing or not in the format above.
    """
    path = Path(folder) / TOKEN_COUNTS
    try:
        counts = json.loads(path.read_text())["counts"]
        return [int(i) for i, _ in counts]
    except FileNotFoundError:
        raise DraftVocabUnavailable(f"{path} does not exist: a pruned draft head needs the draft's token "
                                    f"counts (fastmode distill writes them; python -m models.distill.counts "
                                    f"counts them for a draft made before)") from None
    except (ValueError, KeyError, TypeError) as e:
        raise DraftVocabUnavailable(f"{path} is not a token-counts file ({e})") from None


def count_tokens(answers: Iterable[Iterable[int]]) -> dict:
    """The ``TOKEN_COUNTS`` record of ``answers`` (token id sequences): ids most frequent first, ties by id."""
    counts: dict[int, int] = {}
    total = 0
    for ids in answers:
        for t in ids:
            counts[int(t)] = counts.get(int(t), 0) + 1
            total += 1
    return {"tokens": total, "counts": [[t, n] for t, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]}


def keep_ids(ranked: list[int], size: int, vocab_size: int, always: Iterable[int] = ()) -> torch.Tensor:
    """The ids a pruned head keeps, ascending: ``always``, then ``ranked`` in order, then the rest of
    the vocabulary by id, until ``size`` rounded up to a multiple of ``BLOCK`` (at most ``vocab_size``).

    Raises:
        InvalidLayout: ``size`` is not positive, or an id is outside the vocabulary.
    """
    if size <= 0:
        raise InvalidLayout(f"draft_vocab must be a positive number of tokens, got {size}")
    want = min(-(-max(size, len(set(always))) // BLOCK) * BLOCK, vocab_size)
    chosen: dict[int, None] = {}
    for t in (*always, *ranked):
        if not 0 <= t < vocab_size:
            raise InvalidLayout(f"token id {t} is outside the draft's vocabulary of {vocab_size}")
        if len(chosen) >= want:
            break
        chosen[t] = None
    t = 0
    while len(chosen) < want:
        chosen.setdefault(t, None)
        t += 1
    return torch.tensor(sorted(chosen), dtype=torch.long)


def checked_ids(ids, vocab_size: int) -> torch.Tensor:
    """``ids`` (token ids, as ``keep_ids`` makes them) as a ``long`` tensor, once checked.

    Raises:
        InvalidLayout: ``ids`` is empty, not ascending without repeats, or outside the vocabulary.
    """
    keep = torch.as_tensor(list(ids) if not isinstance(ids, torch.Tensor) else ids, dtype=torch.long).flatten()
    if keep.numel() == 0:
        raise InvalidLayout("a cut vocabulary needs at least one token id")
    if bool((keep[1:] <= keep[:-1]).any()):
        raise InvalidLayout("a cut vocabulary's token ids must be ascending, without repeats")
    if int(keep[0]) < 0 or int(keep[-1]) >= vocab_size:
        raise InvalidLayout(f"a cut vocabulary's token ids must lie in the model's vocabulary of {vocab_size}")
    return keep


def other_ids(keep: Iterable[int], vocab_size: int) -> list[int]:
    """Every id of the vocabulary outside ``keep``: what transformers' ``suppress_tokens`` takes to
    produce only ``keep``, as a cut head does (the reference the eval and the tests compare with)."""
    kept = {int(t) for t in keep}
    return [t for t in range(vocab_size) if t not in kept]


def prune_head(model: nn.Module, keep: torch.Tensor) -> None:
    """Replace ``model.lm_head`` (whole, not tensor-parallel) by its rows ``keep``: the model's logits
    become ``[..., len(keep)]``, column ``j`` the logit of token ``keep[j]``. A tied embedding keeps
    its whole table (the head gets its own copy of the kept rows). Apply it before packing or compiling."""
    head = model.lm_head
    if type(head) is not nn.Linear or head.bias is not None:
        raise InvalidLayout("a cut vocabulary needs the whole model's plain head (no tensor parallelism, no bias)")
    pruned = nn.Linear(head.in_features, len(keep), bias=False, device=head.weight.device, dtype=head.weight.dtype)
    pruned.weight.data.copy_(head.weight.data[keep.to(head.weight.device)])
    pruned.requires_grad_(False)
    model.lm_head = pruned


def expand(logits: torch.Tensor, keep: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """A pruned head's logits ``[..., len(keep)]`` as float32 logits over the whole vocabulary, ``-inf``
    outside ``keep``."""
    full = torch.full((*logits.shape[:-1], vocab_size), float("-inf"), dtype=torch.float32, device=logits.device)
    full[..., keep.to(logits.device)] = logits.float()
    return full


class PromptRows:
    """A cut head widened, per request, by its own prompt's tokens (the fast lane's
    ``vocab_keeps_prompt``).

    A model that answers from its question copies names, places, numbers and code identifiers out
    of it, and those are rarely among the most frequent tokens a cut head keeps. For each request
    this holds the whole head's rows of its prompt's ids outside ``keep`` (at admission: one gather),
    and each step adds their logits to the request's row: ``len(keep)`` rows shared by the batch,
    plus a few of its own per request. A request's output depends only on its own prompt, never on
    what else is batched with it.

    Args:
        weight: the whole head's ``[V, D]`` rows (taken before ``prune_head``; a tied head's is the
            embedding table, not copied).
        keep: the ids the cut head keeps.
        softcap: the model's ``final_logit_softcapping`` (its logits go through it, as ``compute_logits``).
    """

    def __init__(self, weight: torch.Tensor, keep: torch.Tensor, softcap: float | None = None) -> None:
        self.weight, self.softcap = weight.detach(), softcap
        self.kept = torch.zeros(weight.shape[0], dtype=torch.bool, device=weight.device)
        self.kept[keep.to(weight.device)] = True
        self._rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def admit(self, slot: int, prompt: Iterable[int]) -> None:
        """Slot ``slot`` now holds a request of prompt ``prompt``: its ids outside ``keep``, and their rows."""
        ids = torch.tensor(sorted(set(prompt)), dtype=torch.long, device=self.weight.device)
        ids = ids[(ids >= 0) & (ids < self.weight.shape[0])]
        ids = ids[~self.kept[ids]]
        if ids.numel():
            self._rows[slot] = (ids, self.weight[ids].float())
        else:
            self._rows.pop(slot, None)

    def free(self, slot: int) -> None:
        """The slot's request is gone."""
        self._rows.pop(slot, None)

    def fill(self, logits: torch.Tensor, hidden: torch.Tensor, slots: Iterable[int]) -> torch.Tensor:
        """Write into whole-vocabulary logits ``[B, ..., V]`` (``expand``'s) each row's prompt-token
        logits, from the normed hidden states ``[B, ..., D]`` the cut head read; ``slots``: each row's slot."""
        for b, slot in enumerate(slots):
            entry = self._rows.get(int(slot))
            if entry is None:
                continue
            ids, rows = entry
            extra = hidden[b].float() @ rows.T
            if self.softcap is not None:
                extra = torch.tanh(extra / self.softcap) * self.softcap
            logits[b][..., ids] = extra
        return logits
