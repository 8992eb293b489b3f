"""The folder a vLLM sampler starts from (minite.engines.vllm.hf_export): the weights copied as they
are, config.json's quantization_config written for the recipe's sampler (none for plain vLLM)."""

import json

import pytest

from minite.configuration import from_dict
from minite.engines.vllm.hf_export import write_sampler_checkpoint
from minite.engines.vllm.layout import quantization_config
from minite.recipes import BF16, MINITE, TE_NVFP4, NumericsSpec, get_recipe


def _hf_dir(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"num_hidden_layers": 4, "quantization_config": {"x": 1}}))
    (src / "model.safetensors").write_bytes(b"")
    return src


def test_write_sampler_checkpoint(tmp_path):
    src = _hf_dir(tmp_path)
    assert quantization_config(BF16.sampler, 4) is None
    out = write_sampler_checkpoint(src, tmp_path / "bf16", BF16)
    assert "quantization_config" not in json.loads((out / "config.json").read_text())  # stale one removed
    assert (out / "model.safetensors").is_file()
    for recipe in (MINITE, TE_NVFP4):
        out = write_sampler_checkpoint(src, tmp_path / recipe.name, recipe)
        qcfg = json.loads((out / "config.json").read_text())["quantization_config"]
        assert qcfg["quant_method"] == "minite" and qcfg["num_hidden_layers"] == 4
        assert from_dict(NumericsSpec, qcfg["numerics"]) == recipe.sampler
    with pytest.raises(FileNotFoundError):
        write_sampler_checkpoint(tmp_path / "missing", tmp_path / "x", BF16)


def test_the_writer_takes_the_recipe_object_not_a_name(tmp_path):
    """The caller's recipe (an ablation's overrides included) is what vLLM's folder describes: a name
    would be resolved again to the registry's recipe, so the writer refuses one."""
    src = _hf_dir(tmp_path)
    with pytest.raises(TypeError, match="get_recipe"):
        write_sampler_checkpoint(src, tmp_path / "x", "minite")
    out = write_sampler_checkpoint(src, tmp_path / "m", get_recipe("minite"))
    assert json.loads((out / "config.json").read_text())["quantization_config"]["quant_method"] == "minite"
