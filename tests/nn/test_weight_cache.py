"""The quantized-weight cache never serves a stale weight.

The trainer's forward runs on fresh bf16 copies of the fp32 masters (functional_call). A copy made
after an optimizer step can land at the address of a freed copy, with the same version counter 0: a
cache keyed on (version, address) alone then returned the previous step's quantized weight for some
layers (observed: 40 stale experts/linears out of ~50 on the tiny model). The cache now also holds a
weak reference and hits only on the same live tensor.
"""

import torch

from minite.engines.trainer import OptimConfig, Trainer, forward
from minite.models.tiny import build_tiny_model
from minite.recipes import get_recipe
from minite.rl.grpo import GRPOConfig


def _trainer(model):
    return Trainer(model, get_recipe("minite"), OptimConfig(), GRPOConfig(group_size=2))


def test_forward_after_in_place_update_uses_the_new_weights():
    ids = torch.randint(3, 32, (4, 12), generator=torch.Generator().manual_seed(0))
    tr = _trainer(build_tiny_model(seed=0))
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        with torch.no_grad():
            forward(tr.model, torch.bfloat16, input_ids=ids, use_cache=False)  # fills the caches
            for p in tr.model.parameters():  # what optimizer.step does: in place
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
        with torch.no_grad():
            got = forward(tr.model, torch.bfloat16, input_ids=ids, use_cache=False)
        fresh = build_tiny_model(seed=0)
        fresh.load_state_dict(tr.model.state_dict())
        with torch.no_grad():
            want = forward(_trainer(fresh).model, torch.bfloat16, input_ids=ids, use_cache=False)
        assert torch.equal(got, want)


def test_cache_hits_on_the_same_unchanged_tensor_only():
    from minite.nn.linear import WeightQuantCache
    from minite.numerics import QuantSpec

    cache, spec = WeightQuantCache(), QuantSpec()
    w = torch.randn(16, 32)
    q1 = cache.get("w", w, w, spec, "w")
    assert cache.get("w", w, w, spec, "w") is q1
    w.mul_(2)  # version bump
    q2 = cache.get("w", w, w, spec, "w")
    assert q2 is not q1
    other = w.clone()  # same values, another tensor
    assert cache.get("w", other, other, spec, "w") is not q2
