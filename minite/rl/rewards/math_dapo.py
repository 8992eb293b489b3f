r"""DAPO's math reward, as verl implements it (`verl.utils.reward_score.math_dapo`), rewritten here.

The rule, in the order verl applies it:
1. Only the last 300 characters of the completion are read (the longest MATH-500 answer has 159).
2. The answer is the text after the *last* `Answer:` (any case, spaces around the colon allowed) up
   to the end of that line; no such line gives the prediction "[INVALID]".
3. Prediction and ground truth go through the same Minerva normalization (Lewkowycz et al. 2022,
   the one lm-eval's minerva_math and verl use): keep what follows the last "=", drop articles,
   spaces, units and other words of the list below, unwrap `\text{}`, `\textbf{}`, `\overline{}`,
   `\boxed{}` and the first `$...$`, complete shorthand `\fracab` / `\sqrta`, drop thousands
   separators of plain integers.
4. Score +1.0 when the two normalized strings are equal, else -1.0 (a missing answer is just wrong).

`strict_box=True` is verl's `strict_box_verify`: the last `\boxed{}` within the final 100 characters,
compared verbatim with the ground truth. The optional overlong penalty of DAPO lives with the other
length-aware shaping in `minite.rl.rewards` (it needs the token count, not the text).

Everything here is string manipulation: no answer can make it raise or run long, which is why the
5,000-digit answer that trips sympy-based graders is an ordinary (wrong or right) string here.
"""

from __future__ import annotations

import re

from minite.rl.rewards.score import Score, last_boxed

TAIL_CHARS = 300  # characters of the completion that are read
STRICT_TAIL_CHARS = 100
INVALID = "[INVALID]"
_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

# (old, new) string replacements, applied in this order
_REPLACE: tuple[tuple[str, str], ...] = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
# then these substrings are deleted, in this order
_DELETE: tuple[str, ...] = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)
# then these regex rewrites, in this order
_REWRITE: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(.*?)(\$)(.*?)(\$)(.*)"), r"$\3$"),  # keep the first $...$ (with its dollars)
    (re.compile(r"(\\text\{)(.*?)(\})"), r"\2"),
    (re.compile(r"(\\textbf\{)(.*?)(\})"), r"\2"),
    (re.compile(r"(\\overline\{)(.*?)(\})"), r"\2"),
    (re.compile(r"(\\boxed\{)(.*)(\})"), r"\2"),  # greedy: up to the last closing brace
    (re.compile(r"(frac)([^{])(.)"), r"frac{\2}{\3}"),
    (re.compile(r"(sqrt)([^{])"), r"sqrt{\2}"),
)


def normalize(answer: str) -> str:
    """The Minerva normalization of a final answer (step 3 of the module docstring)."""
    text = answer.split("=")[-1]
    for old, new in _REPLACE:
        text = text.replace(old, new)
    for word in _DELETE:
        text = text.replace(word, "")
    for pattern, repl in _REWRITE:
        text = pattern.sub(repl, text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def extract_answer(solution_str: str) -> str | None:
    """The raw text of the last `Answer:` line of the completion's tail, None when there is none."""
    found = _ANSWER_LINE.findall(solution_str[-TAIL_CHARS:])
    return found[-1] if found else None


def compute_score(solution_str: str, ground_truth: str, strict_box: bool = False) -> Score:
    """+1.0 if the completion's answer matches `ground_truth` after normalization, else -1.0."""
    tail = solution_str[-TAIL_CHARS:]
    if strict_box:
        pred = last_boxed(tail[-STRICT_TAIL_CHARS:])
        correct = pred == ground_truth
        return Score(1.0 if correct else -1.0, correct, pred, no_answer=pred is None)
    raw = extract_answer(tail)
    pred = normalize(raw if raw is not None else INVALID)
    correct = pred == normalize(ground_truth)
    return Score(1.0 if correct else -1.0, correct, pred, no_answer=raw is None)
