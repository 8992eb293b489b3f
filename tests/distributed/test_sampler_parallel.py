"""vLLM tensor/data parallel settings in the RL config (rl.sampler): validated, passed to vLLM's LLM."""

import pytest

from minite.configuration import ConfigError
from minite.rl.loop import SamplerConfig, TrainConfig, make_sampler


def test_defaults_add_nothing():
    assert SamplerConfig(engine="vllm").engine_kwargs() == {}


def test_tensor_parallel_reaches_the_engine_arguments():
    cfg = SamplerConfig(engine="vllm", tensor_parallel_size=4)
    assert cfg.engine_kwargs() == {"tensor_parallel_size": 4}


@pytest.mark.parametrize("kw", [{"tensor_parallel_size": 2}, {"data_parallel_size": 2}])
def test_the_builtin_engine_is_one_device(kw):
    with pytest.raises(ConfigError, match="needs engine 'vllm'"):
        SamplerConfig(engine="builtin", **kw)


def test_data_parallel_needs_an_external_launcher(tmp_path):
    cfg = TrainConfig(
        model_dir=str(tmp_path),
        data_dir=str(tmp_path),
        out_dir=str(tmp_path),
        sampler=SamplerConfig(engine="vllm", data_parallel_size=2),
    )
    with pytest.raises(ConfigError, match="external launcher"):
        make_sampler(cfg, None, None, None)
