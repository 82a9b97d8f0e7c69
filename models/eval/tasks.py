"""Checkable instruction tasks the eval generates itself: chat questions with one right answer.

Every sample is drawn from ``random.Random(f"{seed}:{kind}:{i}")``, so a seed gives the same
questions on every machine and Python version, and adding a kind or a sample leaves the others as
they were. Questions are posed as one ``user`` chat message (rendered by the model's chat
template); answers are read leniently but deterministically:

- a number answer: the first number in the reply after its last ``=`` (so "3 + 4 = 7" reads 7),
  else the first number in it (so "The answer is 7." reads 7); thousands separators and a
  trailing ``.0`` are accepted;
- a choice among the words of the question (a list's items, the names in a sentence): the
  candidate the reply mentions first, as a whole word, case-insensitively; a reply that mentions
  none is wrong.

The kinds, at the difficulty where SmolLM2-135M-Instruct scores well above each kind's trivial
baseline (docs/quality-eval.md has the measured figures and the forms it failed at: two-digit,
subtraction and multiplication arithmetic, counting, the largest of a list, conversions without an example):

| kind | question | trivial baseline |
|---|---|---|
| ``add`` | the sum of two one-digit numbers | the larger operand |
| ``convert`` | metres to centimetres, kilograms to grams, ..., after one worked example of the same units | the number given |
| ``list_first`` / ``list_last`` | the first / last item of a list of 3-6 words | a random item |
| ``extract_name`` | who in a two-person sentence has a given job | a random one of the two |
| ``extract_city`` | where a person lives (the sentence names two cities) | a random one of the two |
| ``extract_year`` | the year in a sentence that has two numbers | a random one of the two |
| ``extract_email`` | the email address in a sentence, after one worked example | the sentence's first word |

An email is read as the first ``name@domain`` in the reply (case-insensitive).

These questions are made here, fresh per seed: no model's training data contains them verbatim
(their forms are common, so a model may well have seen similar ones).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

KINDS = ("add", "convert", "list_first", "list_last", "extract_name", "extract_city",
         "extract_year", "extract_email")

WORDS = ("apple", "river", "candle", "tiger", "window", "garden", "pencil", "rocket", "violin", "basket",
         "mirror", "ladder", "orange", "planet", "button", "jacket", "turtle", "castle", "bottle", "forest",
         "hammer", "carpet", "dragon", "pillow", "saddle", "wallet", "anchor", "lemon", "cactus", "helmet")
NAMES = ("Alice", "Bruno", "Carmen", "Daniel", "Elena", "Farid", "Greta", "Hiro", "Ingrid", "Jamal",
         "Kofi", "Lena", "Marco", "Nadia", "Oscar", "Priya", "Quentin", "Rosa", "Samir", "Tara")
CITIES = ("Paris", "Tokyo", "Cairo", "Lima", "Oslo", "Dublin", "Madrid", "Nairobi", "Seoul", "Toronto",
          "Vienna", "Lisbon", "Mumbai", "Sydney", "Berlin", "Quito")
UNITS = (("meters", "centimeters", 100), ("kilograms", "grams", 1000), ("kilometers", "meters", 1000),
         ("liters", "milliliters", 1000), ("centimeters", "millimeters", 10))
JOBS = ("a teacher", "a doctor", "a baker", "a pilot", "an engineer", "a painter")
THINGS = ("bridge", "library", "railway", "museum", "stadium", "harbour")
DOMAINS = ("example.com", "mail.org", "post.net", "inbox.io")


class TaskError(ValueError):
    """A task kind that does not exist, or a sample count that cannot be drawn."""


@dataclass(frozen=True)
class TaskSample:
    """One generated question: send ``messages`` (ChatML roles), grade the reply with ``grade``."""

    kind: str
    index: int
    messages: tuple[tuple[str, str], ...]
    """``(role, content)`` pairs: the question last, after any worked example (a user/assistant pair)."""
    answer: str
    """The ground truth, as the grader reads it (a number's digits, one candidate, an address)."""
    candidates: tuple[str, ...] = ()
    """For a choice: the words of the question the answer is one of (empty otherwise)."""
    baseline: str = ""
    """The trivial baseline's reply (a guess that does not solve the task)."""

    @property
    def id(self) -> str:
        return f"{self.kind}/{self.index}"

    @property
    def question(self) -> str:
        return self.messages[-1][1]

    def chat(self) -> list[dict[str, str]]:
        """The messages as OpenAI-style ``{"role", "content"}`` dicts."""
        return [{"role": r, "content": c} for r, c in self.messages]

    def grade(self, reply: str) -> bool:
        """Whether ``reply`` gives this sample's answer (module docstring: how it is read)."""
        if self.candidates:
            return first_candidate(reply, self.candidates) == self.answer
        if "@" in self.answer:
            m = _EMAIL.search(reply)
            return m is not None and m.group().lower() == self.answer.lower()
        got = parse_number(reply)
        return got is not None and got == int(self.answer)


_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?![\d,])|-?\d+(?:\.\d+)?")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)*\.[A-Za-z]{2,}")


def parse_number(reply: str) -> int | float | None:
    """The number a reply gives: the first after its last ``=``, else its first; ``None`` if none."""
    tail = reply.rsplit("=", 1)[-1] if "=" in reply else reply
    m = _NUMBER.search(tail) or _NUMBER.search(reply)
    if m is None:
        return None
    value = float(m.group().replace(",", ""))
    return int(value) if value.is_integer() else value


def first_candidate(reply: str, candidates: tuple[str, ...]) -> str | None:
    """The candidate ``reply`` mentions first as a whole word (case-insensitive), or ``None``."""
    best, at = None, len(reply) + 1
    for c in candidates:
        m = re.search(rf"(?<![\w@.]){re.escape(c)}(?![\w@])", reply, re.IGNORECASE)
        if m and m.start() < at:
            best, at = c, m.start()
    return best


def _ask(question: str, example: tuple[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    shot = (("user", example[0]), ("assistant", example[1])) if example else ()
    return (*shot, ("user", question))


def _add(rng: random.Random, i: int) -> TaskSample:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return TaskSample("add", i, _ask(f"What is {a} + {b}?"), str(a + b), baseline=str(max(a, b)))


def _convert(rng: random.Random, i: int) -> TaskSample:
    src, dst, factor = rng.choice(UNITS)
    shown, n = rng.sample(range(2, 10), 2)
    ask = f"How many {dst} are in {{}} {src}?"
    return TaskSample("convert", i, _ask(ask.format(n), (ask.format(shown), str(shown * factor))),
                      str(n * factor), baseline=str(n))


def _items(rng: random.Random) -> list[str]:
    return rng.sample(WORDS, rng.randint(3, 6))


def _list_first(rng: random.Random, i: int) -> TaskSample:
    items = _items(rng)
    return TaskSample("list_first", i, _ask(f"What is the first item of this list: {', '.join(items)}?"),
                      items[0], tuple(items), rng.choice(items))


def _list_last(rng: random.Random, i: int) -> TaskSample:
    items = _items(rng)
    return TaskSample("list_last", i, _ask(f"What is the last item of this list: {', '.join(items)}?"),
                      items[-1], tuple(items), rng.choice(items))


def _extract_name(rng: random.Random, i: int) -> TaskSample:
    who, friend = rng.sample(NAMES, 2)
    city, job = rng.choice(CITIES), rng.choice(JOBS)
    text = f"{who} is {job} in {city}. Every Sunday, {who} calls an old friend named {friend}."
    return TaskSample("extract_name", i, _ask(f"{text}\nWho is {job}? Answer with just the name."), who,
                      (who, friend), rng.choice((who, friend)))


def _extract_city(rng: random.Random, i: int) -> TaskSample:
    who = rng.choice(NAMES)
    home, trip = rng.sample(CITIES, 2)
    text = f"{who} lives in {home} and is planning a trip to {trip} next year."
    return TaskSample("extract_city", i, _ask(f"{text}\nWhere does {who} live?"), home, (home, trip),
                      rng.choice((home, trip)))


def _extract_year(rng: random.Random, i: int) -> TaskSample:
    year, took, thing = str(rng.randint(1850, 2020)), str(rng.randint(2, 12)), rng.choice(THINGS)
    text = f"The {thing} was finished in {year} after {took} years of work."
    return TaskSample("extract_year", i, _ask(f"{text}\nIn what year was the {thing} finished?"), year,
                      (year, took), rng.choice((year, took)))


def _email(rng: random.Random) -> str:
    return f"{rng.choice(NAMES).lower()}{rng.randint(1, 99)}@{rng.choice(DOMAINS)}"


def _extract_email(rng: random.Random, i: int) -> TaskSample:
    shown, email = _email(rng), _email(rng)
    ask = "{}\nWhat is the email address in this text?"
    example = ask.format(f"Send the files to {shown} by noon."), shown
    text = f"Please write to {email} before Friday if you can come to the meeting."
    return TaskSample("extract_email", i, _ask(ask.format(text), example), email, baseline=text.split()[0])


GENERATORS: dict[str, Callable[[random.Random, int], TaskSample]] = {
    "add": _add, "convert": _convert, "list_first": _list_first,
    "list_last": _list_last, "extract_name": _extract_name, "extract_city": _extract_city,
    "extract_year": _extract_year, "extract_email": _extract_email,
}


def generate(n: int, seed: int = 0, kinds: tuple[str, ...] = KINDS) -> list[TaskSample]:
    """``n`` samples, the kinds in turn (``kinds[i % len(kinds)]``), each from its own seeded draw."""
    unknown = [k for k in kinds if k not in GENERATORS]
    if unknown or not kinds:
        raise TaskError(f"unknown task kinds {unknown} (known: {', '.join(KINDS)})" if unknown
                        else "no task kinds given")
    if n < 0:
        raise TaskError(f"cannot draw {n} samples")
    out = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        out.append(GENERATORS[kind](random.Random(f"{seed}:{kind}:{i}"), i))
    return out
