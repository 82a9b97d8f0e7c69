"""The prompts the full model answers for its student: generated, deterministic per seed.

Instruction prompts are built from templates over small word lists (facts, definitions, short
writing, arithmetic, lists, conversions, code requests), and code prompts ask to continue a few
lines of a Python standard-library file from the recipe's *training* split (the quality eval's
next-line task draws on the held-out split, which never appears here). The generated instruction
forms overlap in kind with the eval's generated tasks, with their own seed; the eval says so.

Two prompt sets (``DistillConfig.prompt_set``):

- ``1``: the instructions and code continuations above, each one user message (the shipped
  student's set; unchanged, so its preset still reproduces it);
- ``2``: set 1's kinds, plus questions answered by copying from their own text (who has a job or
  lives where in a sentence naming two people or places, the year of a sentence with two numbers,
  an address or a date in a sentence, a list's first, last or n-th item), some of them, and some
  arithmetic and conversions, after one worked example (a user/assistant pair, as few-shot
  prompts come). A small student does not learn to copy from its context on set 1's prompts. These
  kinds are the eval's generated kinds (``models.eval.tasks``) in other words, with other names,
  places and items, drawn from another seed: the eval's scores on those kinds are in-distribution
  for a set-2 student, and ``docs/quality-eval.md`` says so.

A prompt is a string (one user message) or a tuple of ``(role, content)`` pairs ending with the user's.
"""

from __future__ import annotations

import random

Prompt = str | tuple[tuple[str, str], ...]
PROMPT_SETS = (1, 2)

COUNTRIES = ["France", "Japan", "Brazil", "Canada", "Egypt", "India", "Italy", "Kenya", "Mexico", "Norway",
             "Peru", "Spain", "Germany", "China", "Australia", "Greece", "Turkey", "Sweden", "Chile", "Portugal"]
TOPICS = ["photosynthesis", "gravity", "a database index", "recursion", "the water cycle", "inflation",
          "a hash table", "machine learning", "the immune system", "electricity", "a compiler", "democracy",
          "volcanoes", "an API", "encryption", "the moon's phases", "a linked list", "climate", "vaccines",
          "the internet", "a binary search", "evolution", "a CPU cache", "friction"]
THINGS = ["a cat", "the ocean", "a rainy day", "a library", "coffee", "a mountain", "a city at night", "autumn",
          "a train journey", "a garden", "the stars", "a bicycle"]
TASKS = ["reverses a string", "checks whether a number is prime", "returns the largest item of a list",
         "counts the vowels in a string", "computes the factorial of n", "merges two sorted lists",
         "removes duplicates from a list", "returns the n-th Fibonacci number", "checks whether a string is a "
         "palindrome", "sums the digits of an integer", "converts Celsius to Fahrenheit", "flattens a nested list",
         "counts the words in a sentence", "returns the even numbers of a list", "computes the mean of a list"]
UNITS = [("km", "m", 1000), ("m", "cm", 100), ("kg", "g", 1000), ("hours", "minutes", 60), ("minutes", "seconds", 60),
         ("liters", "milliliters", 1000), ("days", "hours", 24), ("feet", "inches", 12)]
WORDS = ["apple", "river", "stone", "cloud", "tiger", "pencil", "window", "garden", "music", "silver", "planet",
         "bridge", "candle", "forest", "rocket", "violin"]


def _instruction(rng: random.Random) -> str:
    kind = rng.randrange(9)
    if kind == 0:
        return f"What is the capital of {rng.choice(COUNTRIES)}?"
    if kind == 1:
        return rng.choice(["Explain {} in one sentence.", "What is {}?", "Explain {} to a child.",
                           "Give two facts about {}."]).format(rng.choice(TOPICS))
    if kind == 2:
        return rng.choice(["Write a short poem about {}.", "Describe {} in two sentences.",
                           "Write one sentence about {}."]).format(rng.choice(THINGS))
    if kind == 3:
        a, b = rng.randrange(2, 100), rng.randrange(2, 100)
        op = rng.choice(["+", "-", "*"])
        return rng.choice(["What is {} {} {}?", "Compute {} {} {}.", "Calculate {} {} {} and explain."]).format(a, op, b)
    if kind == 4:
        items = rng.sample(WORDS, rng.randrange(3, 7))
        return rng.choice(["Sort these words alphabetically: {}.", "Which word is the longest: {}?",
                           "How many words are in this list: {}?", "What is the first word in: {}?"]).format(
            ", ".join(items))
    if kind == 5:
        src, dst, _ = rng.choice(UNITS)
        return f"Convert {rng.randrange(1, 50)} {src} to {dst}."
    if kind == 6:
        return f"Write a Python function that {rng.choice(TASKS)}."
    if kind == 7:
        nums = [rng.randrange(1, 60) for _ in range(rng.randrange(3, 7))]
        return rng.choice(["What is the sum of {}?", "What is the largest number in {}?",
                           "What is the last number in {}?"]).format(nums)
    return rng.choice(["Give me a synonym for {}.", "Use the word {} in a sentence.",
                       "What rhymes with {}?"]).format(rng.choice(WORDS))


def _code(rng: random.Random, files: list) -> str | None:
    source = rng.choice(files)
    lines = source.text.splitlines()
    if len(lines) < 12:
        return None
    start = rng.randrange(0, len(lines) - 8)
    snippet = "\n".join(lines[start : start + rng.randrange(4, 9)])
    if not snippet.strip() or len(snippet) > 600:
        return None
    return f"Continue this Python code:\n```python\n{snippet}\n```"

# Set 2: their own names, places and items (none of them the eval's).
PEOPLE = ["Amara", "Bastian", "Chloe", "Dmitri", "Esther", "Felix", "Gwen", "Hassan", "Isla", "Jonas", "Keiko",
          "Luis", "Maya", "Nikolai", "Olivia", "Pedro", "Rania", "Stefan", "Ursula", "Victor", "Wen", "Yusuf"]
TOWNS = ["Bergen", "Porto", "Kyoto", "Accra", "Montreal", "Krakow", "Hanoi", "Bogota", "Zurich", "Auckland",
         "Dakar", "Seville", "Tallinn", "Manila", "Denver", "Riga", "Havana", "Perth"]
ROLES = ["a nurse", "a chef", "a lawyer", "a farmer", "a dentist", "an architect", "a writer", "a plumber"]
PLACES = ["tower", "canal", "cathedral", "lighthouse", "tunnel", "school", "hospital", "theatre"]
ITEMS = ["mango", "kettle", "scarf", "piano", "glove", "compass", "shovel", "wagon", "peach", "lantern", "blanket",
         "trumpet", "marble", "notebook", "pepper", "ribbon", "tulip", "whistle"]
HOSTS = ["company.com", "school.edu", "team.org", "letters.net"]
MONTHS = ["January", "March", "April", "June", "July", "September", "October", "December"]
ORDINALS = ["first", "second", "third"]


def _sentence_person(rng: random.Random) -> tuple[str, str]:
    a, b = rng.sample(PEOPLE, 2)
    role, town = rng.choice(ROLES), rng.choice(TOWNS)
    text = rng.choice(["{a} works as {r} in {t}, and {b} is {a}'s neighbour.",
                       "{a} is {r}. On Fridays {a} has lunch with {b}.",
                       "In {t}, {a} has been {r} for ten years; {b} moved there last spring."]).format(
        a=a, b=b, r=role, t=town)
    ask = rng.choice(["Who is {r}?", "Who is {r}? Answer with just the name.", "Which person is {r}?"])
    return text, ask.format(r=role)


def _sentence_town(rng: random.Random) -> tuple[str, str]:
    who = rng.choice(PEOPLE)
    home, other = rng.sample(TOWNS, 2)
    text = rng.choice(["{w} lives in {h} but often visits {o}.",
                       "{w} grew up in {o} and now lives in {h}.",
                       "After a long holiday in {o}, {w} went back home to {h}."]).format(w=who, h=home, o=other)
    return text, rng.choice(["Where does {w} live?", "In which city does {w} live?",
                             "What city is {w}'s home? Answer with one word."]).format(w=who)


def _sentence_year(rng: random.Random) -> tuple[str, str]:
    year, n, place = rng.randint(1700, 2024), rng.randint(2, 40), rng.choice(PLACES)
    text = rng.choice(["The {p} opened in {y}, and {n} people worked on it.",
                       "Built over {n} years, the {p} was completed in {y}.",
                       "In {y} the town finished its new {p}; it has {n} windows."]).format(p=place, y=year, n=n)
    return text, rng.choice(["When was the {p} finished?", "In which year was the {p} completed?",
                             "What year is mentioned for the {p}?"]).format(p=place)


def _sentence_address(rng: random.Random) -> tuple[str, str]:
    who = rng.choice(PEOPLE)
    if rng.random() < 0.5:
        text = (f"For questions, contact {who} at {who.lower()}.{rng.randint(1, 9)}@{rng.choice(HOSTS)} or "
                f"call the front desk.")
        return text, rng.choice(["What is the email address in this text?", f"What is {who}'s email?"])
    text = f"{who}'s birthday party is on {rng.randint(1, 28)} {rng.choice(MONTHS)} at {rng.randint(1, 9)} pm."
    return text, rng.choice(["On what date is the party?", f"When is {who}'s party?"])


def _list_question(rng: random.Random) -> str:
    items = rng.sample(ITEMS, rng.randint(3, 6))
    which = rng.choice(["first", "last", *ORDINALS[1 : len(items) - 1]])
    form = rng.choice(["What is the {w} item of this list: {l}?", "Here is a list: {l}. Which item comes {w}?",
                       "Name the {w} word in: {l}.", "{l}\nWhat is the {w} one?"])
    return form.format(w=which, l=", ".join(items))


def _copy(rng: random.Random) -> str:
    text, ask = rng.choice([_sentence_person, _sentence_town, _sentence_year, _sentence_address])(rng)
    return f"{text}\n{ask}"


def _copy_instruction(rng: random.Random) -> Prompt:
    """A set-2 prompt: a question answered from its own text, alone or after a worked example."""
    kind = rng.randrange(5)
    if kind == 0:
        return _copy(rng)
    if kind == 1:
        return _list_question(rng)
    if kind == 2:
        a, b = rng.randint(1, 20), rng.randint(1, 9)
        op = rng.choice(["+", "-"])
        return rng.choice(["What is {} {} {}?", "{} {} {} =", "Compute {} {} {}. Answer with the number."]).format(a, op, b)
    # a worked example of the same form first (its answer is the right one, written by hand here)
    if kind == 3:
        src, dst, factor = rng.choice(UNITS)
        shown, n = rng.sample(range(2, 30), 2)
        ask = rng.choice(["How many {d} are in {n} {s}?", "Convert {n} {s} to {d}."])
        shot = (ask.format(d=dst, n=shown, s=src), f"{shown * factor} {dst}")
        return (("user", shot[0]), ("assistant", shot[1]), ("user", ask.format(d=dst, n=n, s=src)))
    items = rng.sample(ITEMS, rng.randint(3, 5))
    shown = rng.sample(ITEMS, rng.randint(3, 5))
    which = rng.choice(["first", "last"])
    ask = "What is the {w} item of this list: {l}?"
    answer = shown[0] if which == "first" else shown[-1]
    return (("user", ask.format(w=which, l=", ".join(shown))), ("assistant", answer),
            ("user", ask.format(w=which, l=", ".join(items))))


def prompt_set(count: int, seed: int, code_share: float = 0.2, version: int = 1,
               copy_share: float = 0.4) -> list[Prompt]:
    """``count`` distinct prompts, the same for a seed and ``version`` (module docstring): about
    ``code_share`` of them code continuations and, in set 2, ``copy_share`` of the rest questions
    answered from their own text."""
    if version not in PROMPT_SETS:
        raise ValueError(f"distill: prompt_set must be one of {PROMPT_SETS}, got {version!r}")
    rng = random.Random(seed)
    files = None
    out: list[Prompt] = []
    seen: set[Prompt] = set()
    while len(out) < count:
        if rng.random() < code_share:
            if files is None:
                from models.recipe import corpus

                files = corpus.split(corpus.list_files())[0]
            prompt = _code(rng, files) if files else None
            if prompt is None:
                continue
        elif version == 2 and rng.random() < copy_share:
            prompt = _copy_instruction(rng)
        else:
            prompt = _instruction(rng)
        if prompt not in seen:
            seen.add(prompt)
            out.append(prompt)
    return out
