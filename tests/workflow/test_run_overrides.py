"""Profiles: `run_overrides` gives one run its own seeds and rl settings (merged after the ablation
file's), and a mistake in it names the key and the closest run or key."""

from __future__ import annotations

import pytest

from minite.configuration import ConfigError
from minite.profiles import load_profile, resolve_run, run_seeds

OVER = {
    "ablations": ["te_nvfp4_tis", "minite_bf16_router"],
    "ablation_seeds": [0, 1, 2],
    "run_overrides": {
        "te_nvfp4_tis": {"seeds": [4, 5], "rl": {"steps": 7, "grpo": {"tis_cap": 3.0}}},
        "bf16": {"rl": {"rollout": {"prompts_per_step": 3}}},
    },
}


def test_seeds_and_rl_of_one_run():
    cfg = load_profile("tiny", OVER)
    assert run_seeds(cfg, "te_nvfp4_tis") == [4, 5]
    assert run_seeds(cfg, "minite_bf16_router") == [0, 1, 2]  # ablation_seeds, untouched
    assert run_seeds(cfg, "minite") == cfg["seeds"]
    tis = resolve_run(cfg, "te_nvfp4_tis")["rl"]
    assert tis["steps"] == 7 and tis["grpo"]["tis"] is True and tis["grpo"]["tis_cap"] == 3.0
    assert tis["rollout"] == cfg["rl"]["rollout"]  # everything else from the profile
    assert resolve_run(cfg, "bf16")["rl"]["rollout"]["prompts_per_step"] == 3
    assert resolve_run(cfg, "minite")["rl"] == cfg["rl"]
    assert resolve_run(cfg, "minite_bf16_router")["rl"]["steps"] == cfg["rl"]["steps"]


@pytest.mark.parametrize(
    "over, expected",
    [
        ({"te_nvfp4_tiss": {"seeds": [0]}}, ["run_overrides.te_nvfp4_tiss", "did you mean 'te_nvfp4_tis'"]),
        ({"bf16": {"sedes": [0]}}, ["run_overrides.bf16.sedes", "did you mean 'seeds'"]),
        ({"bf16": {"rl": {"stpes": 3}}}, ["run_overrides.bf16.rl.stpes", "did you mean 'steps'"]),
        ({"bf16": {"seeds": [0, 0]}}, ["run_overrides.bf16.seeds", "twice"]),
    ],
    ids=["unknown-run", "typo-key", "typo-rl-key", "duplicate-seed"],
)
def test_errors_name_the_key(over, expected):
    with pytest.raises(ConfigError) as e:
        load_profile("tiny", {"ablations": ["te_nvfp4_tis"], "run_overrides": over})
    for part in expected:
        assert part in str(e.value), (part, str(e.value))


def test_an_override_of_a_run_not_selected_stays_unused():
    """Narrowing `ablations` (an overlay, --config) keeps the profile's overrides of the runs it drops:
    they are real runs, not typos, and change nothing."""
    cfg = load_profile(
        "tiny",
        {"ablations": ["te_nvfp4_tis"], "run_overrides": {"minite_bf16_router": {"seeds": [0]}}},
    )
    assert cfg["ablations"] == ["te_nvfp4_tis"]
    assert run_seeds(cfg, "te_nvfp4_tis") == cfg["ablation_seeds"]


def test_the_claims_core_overlay_plans(tmp_path):
    """configs/experiments/claims_core.yaml over the claims profile: the arms and horizons it states."""
    from minite.configuration import load_yaml
    from minite.profiles import REPO

    over = load_yaml(REPO / "configs" / "experiments" / "claims_core.yaml")
    cfg = load_profile("claims", over)
    assert run_seeds(cfg, "minite") == [0, 1, 2] and resolve_run(cfg, "minite")["rl"]["steps"] == 300
    assert (
        run_seeds(cfg, "te_nvfp4_mis") == [0, 1, 2] and resolve_run(cfg, "te_nvfp4_mis")["rl"]["steps"] == 50
    )
    assert run_seeds(cfg, "minite_noise_10") == [0]
    assert set(cfg["claims"]["dose_response"]) <= set(cfg["ablations"])
