"""`minite diagnose` at a sampling temperature other than 1 (minite/diagnostics/diagnosis.py): the recompute
runs at the sampling temperature, so the minite recipe's token gap stays exactly 0 and its
full-vocabulary divergence (of the tempered distributions) is 0 as well; a bad temperature is refused
before any compute."""

from __future__ import annotations

import json

import pytest

from minite.cli import main as cli
from minite.configuration import ConfigError
from minite.diagnostics.diagnosis import DiagnoseConfig


def test_minite_gap_is_zero_at_temperature(tiny_inputs, tmp_path):
    out = tmp_path / "minite"
    rc = cli(
        [
            "diagnose",
            "--model-dir",
            str(tiny_inputs["model_dir"]),
            "--data-dir",
            str(tiny_inputs["data_dir"]),
            "--recipe",
            "minite",
            "--out",
            str(out),
            "--n-prompts",
            "4",
            "--samples-per-prompt",
            "2",
            "--max-new-tokens",
            "4",
            "--temperature",
            "0.7",
            "--no-attribution",
        ]
    )
    assert rc == 0
    js = json.loads((out / "diagnose.json").read_text())
    assert js["config"]["temperature"] == 0.7
    assert js["n_tokens"] > 0
    assert js["mismatch"]["logp_abs_diff_max"] == 0.0 and js["mismatch"]["bitwise_equal_frac"] == 1.0
    assert js["full_vocab"]["kl_t_s"] == 0.0 and js["full_vocab"]["kl_s_t"] == 0.0


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf")])
def test_bad_temperature_is_refused(bad):
    with pytest.raises(ConfigError, match="DiagnoseConfig.temperature must be a finite number >= 0"):
        DiagnoseConfig(model_dir="m", data_dir="d", out_dir="o", temperature=bad)
