r"""Synthetic math word problems with integer answers, made from a seed, for the paper-mini profile.

They exist so that every stage of the paper's setting sees real text through the real tokenizer and
chat template (a verl parquet for RL, MATH-500 / AIME files for lm-eval, `\boxed{}` solutions), not to
be learned: a randomly initialised model answers none of them. Each template is a short English
problem (shopping, travel, sharing, seating, reading) whose answer is a non-negative integer computed
from the drawn numbers, with a one-line worked solution ending in `\boxed{answer}`.

Problems are drawn from `random.Random(seed)`, deduplicated, and split into disjoint sets; growing one
split leaves the others unchanged (the eval split is drawn first).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from minite.rl.data import Example, Problem

NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivan", "Jun", "Kemal", "Lea")
ITEMS = ("apples", "pencils", "stickers", "marbles", "cookies", "stamps", "books", "shells")
SOURCE = "word_problems"


def _buy_give(r: random.Random) -> Problem:
    name, friend = r.sample(NAMES, 2)
    item = r.choice(ITEMS)
    a, b = r.randint(5, 60), r.randint(2, 40)
    c = r.randint(1, a + b)
    ans = a + b - c
    return Problem(
        f"{name} has {a} {item}. {name} buys {b} more and then gives {c} to {friend}. "
        f"How many {item} does {name} have now?",
        f"{name} has ${a} + {b} - {c} = {ans}$ {item}, so the answer is $\\boxed{{{ans}}}$.",
        str(ans),
    )


def _travel(r: random.Random) -> Problem:
    speed, hours = r.randint(20, 120), r.randint(2, 9)
    vehicle = r.choice(("train", "bus", "car", "boat"))
    ans = speed * hours
    return Problem(
        f"A {vehicle} travels at {speed} kilometers per hour for {hours} hours. "
        "How many kilometers does it travel?",
        f"Distance is speed times time: ${speed} \\times {hours} = {ans}$, "
        f"so the answer is $\\boxed{{{ans}}}$.",
        str(ans),
    )


def _share(r: random.Random) -> Problem:
    name = r.choice(NAMES)
    item = r.choice(ITEMS)
    each, friends = r.randint(2, 25), r.randint(2, 12)
    total = each * friends
    return Problem(
        f"{name} shares {total} {item} equally among {friends} friends. "
        f"How many {item} does each friend get?",
        f"Each friend gets ${total} \\div {friends} = {each}$, so the answer is $\\boxed{{{each}}}$.",
        str(each),
    )


def _change(r: random.Random) -> Problem:
    name = r.choice(NAMES)
    item = r.choice(ITEMS)
    price, count = r.randint(1, 9), r.randint(2, 9)
    bill = next(b for b in (20, 50, 100) if b >= price * count)
    ans = bill - price * count
    return Problem(
        f"A shop sells {item} for {price} dollars each. {name} buys {count} of them and pays with a "
        f"{bill}-dollar bill. How many dollars of change does {name} get?",
        f"The {item} cost ${price} \\times {count} = {price * count}$ dollars, and "
        f"${bill} - {price * count} = {ans}$, so the answer is $\\boxed{{{ans}}}$.",
        str(ans),
    )


def _seats(r: random.Random) -> Problem:
    rows, per_row = r.randint(3, 20), r.randint(4, 15)
    taken = r.randint(0, rows * per_row)
    ans = rows * per_row - taken
    return Problem(
        f"A hall has {rows} rows of chairs with {per_row} chairs in each row. {taken} chairs are taken. "
        "How many chairs are empty?",
        f"There are ${rows} \\times {per_row} = {rows * per_row}$ chairs and "
        f"${rows * per_row} - {taken} = {ans}$ are empty, so the answer is $\\boxed{{{ans}}}$.",
        str(ans),
    )


def _reading(r: random.Random) -> Problem:
    name = r.choice(NAMES)
    pages, days = r.randint(5, 40), r.randint(2, 20)
    return Problem(
        f"{name} reads {pages} pages every day. How many days does it take {name} to read a book of "
        f"{pages * days} pages?",
        f"It takes ${pages * days} \\div {pages} = {days}$ days, so the answer is $\\boxed{{{days}}}$.",
        str(days),
    )


TEMPLATES: tuple[Callable[[random.Random], Problem], ...] = (
    _buy_give,
    _travel,
    _share,
    _change,
    _seats,
    _reading,
)


@dataclass(frozen=True)
class WordProblemsConfig:
    seed: int = 0
    n_train: int = 256
    n_eval: int = 32
    n_eval_files: int = 8  # problems in each local eval file (MATH-500 / AIME schemas); 0: none

    def __post_init__(self) -> None:
        from minite.configuration import ConfigError

        for key in ("n_train", "n_eval", "n_eval_files"):
            if getattr(self, key) < 0:
                raise ConfigError(f"word_problems.{key} must be >= 0, got {getattr(self, key)}")
        if self.n_train < 1:
            raise ConfigError("word_problems.n_train must be >= 1 (RL draws its prompts from it)")


def generate(cfg: WordProblemsConfig) -> tuple[list[Problem], list[Problem], list[Problem]]:
    """Disjoint (train, eval, eval_files) problem sets, deterministic in `cfg.seed`."""
    rng = random.Random(cfg.seed)
    sizes = (cfg.n_eval_files, cfg.n_eval, cfg.n_train)  # drawn in this order (see module docstring)
    wanted = sum(sizes)
    seen: set[str] = set()
    drawn: list[Problem] = []
    misses = 0
    while len(drawn) < wanted:
        p = rng.choice(TEMPLATES)(rng)
        if p.problem in seen:
            misses += 1
            if misses > 1000 + 50 * wanted:
                raise ValueError(f"only {len(drawn)} distinct word problems of the {wanted} requested")
            continue
        seen.add(p.problem)
        drawn.append(p)
    files, ev, train = drawn[: sizes[0]], drawn[sizes[0] : sizes[0] + sizes[1]], drawn[sizes[0] + sizes[1] :]
    return train, ev, files


def to_examples(problems: list[Problem], data_source: str = SOURCE) -> list[Example]:
    return [Example(p.problem, p.answer, data_source) for p in problems]
