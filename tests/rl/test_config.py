"""minite.rl.config: the GRPO settings a profile's rl.grpo block gives, as `minite train --config` reads
them (load_train_config): Dr. GRPO's constant from the rollout length, typos refused with the closest name."""

from __future__ import annotations

import pytest
import yaml

from minite.configuration import ConfigError
from minite.rl.config import load_train_config


def _load(tmp_path, grpo: dict, rollout: dict | None = None):
    path = tmp_path / "train.yaml"
    spec = {"model_dir": "m", "data_dir": "d", "out_dir": "o", "grpo": grpo, "rollout": rollout or {}}
    path.write_text(yaml.safe_dump(spec))
    return load_train_config(path)


def test_dr_grpo_constant_is_the_rollout_length_unless_set(tmp_path):
    cfg = _load(tmp_path, {"loss_agg": "seq-mean-token-sum-norm"}, {"max_new_tokens": 24})
    assert cfg.grpo.loss_scale_factor == 24.0
    cfg = _load(
        tmp_path, {"loss_agg": "seq-mean-token-sum-norm", "loss_scale_factor": 100}, {"max_new_tokens": 24}
    )
    assert cfg.grpo.loss_scale_factor == 100.0
    # the other modes do not use it and keep it unset
    assert _load(tmp_path, {"loss_agg": "seq-mean-token-sum"}).grpo.loss_scale_factor is None


@pytest.mark.parametrize(
    ("grpo", "message"),
    [
        (
            {"loss_agg": "seq-mean-token-summ"},
            r"\.grpo: GRPOConfig\.loss_agg .*did you mean 'seq-mean-token-sum'",
        ),
        ({"loss_agg": "tokenmean"}, "did you mean 'token-mean'"),
        ({"kl_loss_type": "lowvarkl"}, "kl_loss_type .*did you mean 'low_var_kl'"),
        ({"kl_coef": -0.1}, "kl_coef must be >= 0"),
        ({"loss_scale_factor": -1}, "loss_scale_factor must be a finite number > 0"),
    ],
)
def test_bad_grpo_values_name_the_key(tmp_path, grpo, message):
    with pytest.raises(ConfigError, match=message):
        _load(tmp_path, grpo)
