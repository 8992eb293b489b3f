"""The paper's claims C1-C5, settled from a profile's results (`minite claims`).

- `verdicts.py`: the verdict rules, written down before the data, and `evaluate`, which applies them to
  every arm's seeds (its docstring states each rule).
- `seeds.py`: what one RL folder, or one results-ledger record, says of a seed (quality, reward
  windows, gap, ...).
- `intervals.py`: intervals over seeds: Student t, paired t, Welch, prediction, bootstrap, and the seeds
  a difference would need.
- `markdown.py`: the Claims section as Markdown (`minite claims --record` writes claims.md + claims.json).
- `noise_calibration.py`: the positive control's logit-noise levels, calibrated from ledger records
  (`minite calibrate-noise`).

The names the verb, the figures and the configs use are importable from `minite.claims` itself.
"""

from minite.claims.noise_calibration import NoiseControl, calibrate_logit_noise
from minite.claims.verdicts import (
    effects_2x2,
    evaluate,
    fmt_interval,
    load_seeds,
    run_name,
    seed_metrics,
)

__all__ = [
    "NoiseControl",
    "calibrate_logit_noise",
    "effects_2x2",
    "evaluate",
    "fmt_interval",
    "load_seeds",
    "run_name",
    "seed_metrics",
]
