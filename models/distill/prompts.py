"""The prompts the full model answers for its student: generated, deterministic per seed.

Instruction prompts are built from templates over small word lists (facts, definitions, short
writing, arithmetic, lists, conversions, code requests), and code prompts ask to continue a few
lines of a Python standard-library file from the recipe's *training* split (the quality eval's
next-line task draws on the held-out split, which never appears here). The generated instruction
forms overlap in kind with the eval's generated tasks, with their own seed; the eval says so.
"""

from __future__ import annotations

import random

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


def prompt_set(count: int, seed: int, code_share: float = 0.2) -> list[str]:
    """``count`` distinct user prompts (about ``code_share`` of them code continuations), the same for a seed."""
    rng = random.Random(seed)
    files = None
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < count:
        if rng.random() < code_share:
            if files is None:
                from models.recipe import corpus

                files = corpus.split(corpus.list_files())[0]
            prompt = _code(rng, files) if files else None
            if prompt is None:
                continue
        else:
            prompt = _instruction(rng)
        if prompt not in seen:
            seen.add(prompt)
            out.append(prompt)
    return out
