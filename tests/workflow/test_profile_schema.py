"""Profiles: every shipped profile validates; a mistake is reported with the key, where it was set and
the closest valid key; the JSON schema stays in sync with the dataclasses it mirrors."""

from __future__ import annotations

import dataclasses

import pytest

from minite.configuration import ConfigError
from minite.profiles import (
    PROFILE_SCHEMA,
    coerce_cli,
    known_ablations,
    load_profile,
    resolve_run,
    run_names,
)

PROFILES = ["tiny", "tiny-builtin", "test", "h200", "paper"]
RUN_KEYS = {"model_dir", "data_dir", "out_dir", "recipe", "seed"}


@pytest.mark.parametrize("name", PROFILES)
def test_every_profile_validates(name):
    cfg = load_profile(name)
    assert cfg["profile"] == name
    assert run_names(cfg)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({"rl": {"stpes": 3}}, ["rl.stpes", "did you mean 'steps'", "--config"]),
        ({"rl": {"sampler": {"engine": "vlm"}}}, ["rl.sampler.engine", "did you mean 'vllm'"]),
        ({"seeds": 0}, ["seeds", "expected array", "--config 'key=[a,b]'"]),
        ({"recipes": ["bf16", "minte"]}, ["unknown recipe 'minte'", "did you mean 'minite'"]),
        ({"ablations": ["minite_bf16_rooter"]}, ["did you mean 'minite_bf16_router'"]),
        ({"eval": {"tasks": [{"nme": "tiny_arith"}]}}, ["eval.tasks[0].nme", "did you mean 'name'"]),
        ({"prepare": {"kind": "local"}}, ["prepare", "model_path"]),
        ({"rl": {"grpo": {"group_size": 1}}}, ["rl.grpo.group_size", "minimum"]),
    ],
    ids=[
        "typo-key",
        "typo-enum",
        "seeds-not-list",
        "unknown-recipe",
        "unknown-ablation",
        "task-spec-key",
        "local-needs-paths",
        "out-of-range",
    ],
)
def test_errors_are_actionable(overrides, expected):
    with pytest.raises(ConfigError) as e:
        load_profile("tiny", overrides)
    msg = str(e.value)
    for part in expected:
        assert part in msg, (part, msg)


def test_a_typo_in_a_profile_file_names_the_file(tmp_path):
    (tmp_path / "mine.yaml").write_text("extends: tiny\nrl:\n  rollout: {promts_per_step: 4}\n")
    import minite.profiles as P

    # extends resolves inside the same folder: give it the shipped tiny profile too
    (tmp_path / "tiny.yaml").write_text((P.CONFIGS / "tiny.yaml").read_text())
    with pytest.raises(ConfigError) as e:
        load_profile("mine", configs_dir=tmp_path)
    assert "rl.rollout.promts_per_step" in str(e.value)
    assert "did you mean 'prompts_per_step'" in str(e.value)
    assert "mine.yaml" in str(e.value)


def test_unknown_profile_suggests():
    with pytest.raises(ConfigError, match="did you mean 'tiny'"):
        load_profile("tinny")


def test_command_line_values_are_typed():
    # snakemake parses nested --config values with YAML's BaseLoader: everything arrives as strings
    got = coerce_cli(
        {"seeds": ["0", "1"], "rl": {"steps": "4", "optim": {"lr": "1e-4"}, "grpo": {"tis": "true"}}}
    )
    assert got == {"seeds": [0, 1], "rl": {"steps": 4, "optim": {"lr": 1e-4}, "grpo": {"tis": True}}}
    cfg = load_profile("tiny", {"seeds": ["3", "4"], "rl": {"steps": "2"}})
    assert cfg["seeds"] == [3, 4] and cfg["rl"]["steps"] == 2


def _schema_keys(node):
    return set(node["properties"])


def _dc_fields(cls):
    return {f.name for f in dataclasses.fields(cls) if f.init}


def test_rl_schema_mirrors_train_config():
    import typing

    import yaml

    from minite.rl.config import TrainConfig

    schema = yaml.safe_load(PROFILE_SCHEMA.read_text())["properties"]["rl"]
    assert _schema_keys(schema) == _dc_fields(TrainConfig) - RUN_KEYS
    hints = typing.get_type_hints(TrainConfig)
    for key, sub in schema["properties"].items():
        if "properties" in sub:
            assert _schema_keys(sub) == _dc_fields(hints[key]), key


def test_prepare_schema_mirrors_task_and_sft_configs():
    import yaml

    from minite.rl.sft import SFTConfig
    from minite.rl.task import TaskConfig

    prep = yaml.safe_load(PROFILE_SCHEMA.read_text())["properties"]["prepare"]["properties"]
    assert _schema_keys(prep["task"]) == _dc_fields(TaskConfig)
    assert _schema_keys(prep["sft"]) == _dc_fields(SFTConfig)


def test_every_ablation_resolves_to_a_valid_recipe():
    from minite.configuration import from_dict
    from minite.recipes import recipe_from_dict
    from minite.rl.config import TrainConfig

    cfg = load_profile("tiny")
    names = known_ablations(cfg)
    assert {
        "minite_tensor_act_scale",
        "minite_reexport_weights",
        "minite_bf16_router",
        "te_nvfp4_tis",
    } <= set(names)
    for name in names:
        spec = resolve_run(cfg, name)
        recipe = recipe_from_dict(spec["recipe_mapping"])
        assert recipe.name == name
        assert spec["ablation"] == name and spec["recipe"] in cfg["recipes"]
        from_dict(TrainConfig, {**spec["rl"], "model_dir": "", "data_dir": "", "out_dir": ""})
    assert resolve_run(cfg, "te_nvfp4_tis")["rl"]["grpo"]["tis"] is True
    assert resolve_run(cfg, "te_nvfp4")["rl"]["grpo"]["tis"] is False
    act = resolve_run(cfg, "minite_tensor_act_scale")["recipe_mapping"]
    assert (
        act["sampler"]["fprop_act"]["scope"] == "tensor" and act["trainer"]["fprop_act"]["scope"] == "tensor"
    )


def test_ablation_file_errors_name_the_file(tmp_path):
    import shutil

    import minite.profiles as P

    abl = tmp_path / "ablations"
    shutil.copytree(P.CONFIGS / "ablations", abl)
    (abl / "bad.yaml").write_text(
        "recipe: {extends: minite, sampler: {fp32_router: false}}\nrl: {grpo: {tiss: true}}\n"
    )
    with pytest.raises(ConfigError) as e:
        load_profile("tiny", {"ablations": ["bad"], "paths": {"ablations": str(abl)}})
    assert "bad.yaml" in str(e.value) and "did you mean 'tis'" in str(e.value)
