r"""The `\boxed{}` reward: the last `\boxed{...}` of the completion, graded by math-verify.

math-verify (Hugging Face's verifier, the grader of TRL's and open-r1's math rewards) parses both
answers into sympy and compares them as mathematical objects, so `0.875`, `7/8`, `\frac{7}{8}` and
`\dfrac78` are one answer, as are `x=3` and `3`, or `\{1,2\}` and `\{2,1\}`. The ground truth is graded
the way verl's `math_verify` reward does it: wrapped in `\boxed{}` and parsed as LaTeX.

Score 1.0 for a correct answer, 0.0 otherwise. Nothing raises: no `\boxed{}`, an unbalanced one, or an
answer math-verify cannot parse or compare in time all score 0.0; `Score.no_answer` / `Score.error`
say which (a 5,000-digit integer is parsed and compared like any other). math-verify bounds each
parse and comparison with `signal.alarm` (seconds below), which works in the main thread only;
elsewhere its timeouts are off.
"""

from __future__ import annotations

import threading

from minite.rl.rewards.score import Score, last_boxed

PARSE_TIMEOUT_S = 5
VERIFY_TIMEOUT_S = 5
PRED_CHARS = 200  # of the extracted answer kept in a Score (logs, samples)


def _math_verify():
    try:
        import math_verify
    except ImportError as e:  # pragma: no cover - the dependency is in pyproject.toml
        raise ImportError(
            "the boxed reward needs math-verify: pip install 'math-verify[antlr4_11_0]==0.9.0'"
        ) from e
    return math_verify


def check_available() -> None:
    """ImportError with the install line when math-verify is missing (run before any compute)."""
    _math_verify()


def compute_score(solution_str: str, ground_truth: str) -> Score:
    """1.0 if the last `\\boxed{}` of the completion equals `ground_truth` as math-verify judges it."""
    pred = last_boxed(solution_str)
    if pred is None:
        return Score(0.0, False, None, no_answer=True)
    mv = _math_verify()
    from math_verify import LatexExtractionConfig
    from math_verify.errors import TimeoutException  # a BaseException: caught by name

    main = threading.current_thread() is threading.main_thread()
    parse_t, verify_t = (PARSE_TIMEOUT_S, VERIFY_TIMEOUT_S) if main else (None, None)
    latex = [LatexExtractionConfig()]
    try:
        gold = mv.parse("\\boxed{" + ground_truth + "}", latex, parsing_timeout=parse_t, raise_on_error=True)
        guess = mv.parse("\\boxed{" + pred + "}", latex, parsing_timeout=parse_t, raise_on_error=True)
        if not gold:
            return Score(0.0, False, pred[:PRED_CHARS], error=f"ground truth {ground_truth[:80]!r} unparsed")
        if not guess:
            return Score(0.0, False, pred[:PRED_CHARS], no_answer=True)
        ok = bool(mv.verify(gold, guess, timeout_seconds=verify_t, raise_on_error=True))
    except (Exception, TimeoutException) as e:  # the reward never raises; the reason is counted
        return Score(0.0, False, pred[:PRED_CHARS], error=f"{type(e).__name__}: {str(e)[:120]}")
    return Score(1.0 if ok else 0.0, ok, pred[:PRED_CHARS])
