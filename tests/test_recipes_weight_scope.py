"""Recipe validation refuses per-row weight scales where the sampler would need them exported.

The sampler's weight format (minite.engines.weight_sync, the vLLM layout) carries one global scale
per weight tensor, so a recipe whose exported weights are quantized per row must fail when it is
built, not at the first weight export of a run.
"""

import dataclasses

import pytest

from minite.configuration import ConfigError
from minite.numerics.nvfp4 import QuantSpec
from minite.recipes import MINITE, TE_NVFP4, Recipe

ROW_W = QuantSpec(block="1x16", scope="row", flavor="canonical")


def test_trainer_weights_per_row_exported_to_sampler_refused():
    trainer = dataclasses.replace(MINITE.trainer, fprop_weight=ROW_W)
    with pytest.raises(ConfigError, match=r"trainer\.fprop_weight\.scope='row'.*use scope 'tensor'"):
        Recipe("rowweights", trainer=trainer, sampler=MINITE.sampler)


def test_reexported_sampler_weights_per_row_refused():
    sampler = dataclasses.replace(TE_NVFP4.sampler, fprop_weight=ROW_W)
    with pytest.raises(ConfigError, match=r"sampler\.fprop_weight\.scope='row'"):
        Recipe("rowweights", trainer=TE_NVFP4.trainer, sampler=sampler)


def test_per_row_weights_in_a_trainer_whose_sampler_reexports_per_tensor_pass():
    trainer = dataclasses.replace(TE_NVFP4.trainer, fprop_weight=ROW_W)
    assert Recipe("rowtrainer", trainer=trainer, sampler=TE_NVFP4.sampler).trainer.fprop_weight.scope == "row"
