"""A synthetic trainer/sampler mismatch of chosen size: seeded Gaussian noise on the sampler's logits.

Why: the recipes give three gap sizes (bf16 ~1e-3, te_nvfp4 ~1e-1 mean |Δlogp|, minite exactly 0),
too few points to say at which gap learning degrades. Starting from the zero-gap `minite` recipe and
adding noise of standard deviation σ to the sampler's fp32 logits at every decode step,

    z_s = z + σ·ε,   ε ~ N(0, I) per (row, position, vocab entry),   π_s = softmax(z_s / T)

the sampler draws tokens from π_s and reports log π_s, while the trainer recomputes log π from z
(π = softmax(z / T)), so the gap grows continuously with σ and nothing else changes. The noise is part
of the sampled distribution, so it is part of the reported log-prob: the hook perturbs the logits
before the built-in sampler divides them by T (minite.engines.base.temper), and that one tensor
(z + σε) / T gives both the draw and log π_s; the trainer recomputes log π at the same T. For small
σ, Δlogp ≈ (σ/T)(ε_tok − Σ_v π_v ε_v), of variance (σ/T)²(1 − 2π_tok + Σ_v π_v²): near 0 on a token
of probability ~1, up to (σ/T)² on a flat distribution, so the gap depends on the policy's entropy
as well as on σ. The RL loop measures it as for any recipe (`mismatch/logp_abs_diff_mean`,
`mismatch/kl_k3`), and that measured gap is the x axis of the dose-response.

What it models: a rollout defect. Only sampled generation (temperature > 0) is perturbed; greedy
calls (the loop's in-loop eval) and teacher-forced scoring run the clean engine, and lm-eval and
`minite diagnose` build their own engine without noise, so quality is measured on the policy the run
learned, not through the defect.

Seeding: one `torch.Generator` per `generate` call, seeded from the call's `SamplingParams.seed` (a
function of run seed and step) mixed with a constant, so the noise is reproducible, differs from step
to step, and is independent of the token-sampling stream. Built-in engine only: the noise is added by
a forward hook on the engine's `lm_head` (fp32, after the bf16 GEMM, so small σ is not rounded away),
and CUDA-graph replay is switched off (a captured graph would replay one draw). vLLM computes its
log-probs inside its own sampler (processed log-probs, minite.engines.vllm.engine); perturbing them
there needs a vLLM logits processor, which this wrapper does not add.
"""

from __future__ import annotations

import math

import torch

from minite.configuration import ConfigError
from minite.engines.base import Completion, SamplingParams, WeightUpdate

_SALT = 0x9E3779B97F4A7C15  # mixes the rollout seed so the noise stream is not the sampling stream


def noise_seed(sampling_seed: int) -> int:
    """The noise generator's seed for a generate call with `SamplingParams.seed = sampling_seed`."""
    return (int(sampling_seed) * 6364136223846793005 + _SALT) % (1 << 63)


class LogitNoiseSampler:
    """Wraps a `BuiltinSampler`: N(0, std²) noise on its fp32 logits during sampled generation."""

    def __init__(self, inner, std: float) -> None:
        from minite.engines.sampler import BuiltinSampler

        if not isinstance(inner, BuiltinSampler):
            raise ConfigError(
                f"sampler.logit_noise needs the built-in engine, got {type(inner).__name__}; set "
                "sampler.engine to 'builtin' or drop sampler.logit_noise (see minite/engines/noise.py)"
            )
        if not (isinstance(std, int | float) and math.isfinite(std) and std >= 0):
            raise ConfigError(f"sampler.logit_noise must be a finite number >= 0, got {std!r}")
        self.inner = inner
        self.std = float(std)
        self.recipe = inner.recipe
        self._gen: torch.Generator | None = None
        inner.cuda_graphs = False  # a graph would replay one captured draw at every step
        self._hook = inner.model.lm_head.register_forward_hook(self._add_noise)

    def _add_noise(self, module, inputs, output: torch.Tensor) -> torch.Tensor | None:
        if self._gen is None:
            return None
        eps = torch.randn(output.shape, generator=self._gen, dtype=torch.float32, device=output.device)
        return output.float() + self.std * eps

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        if params.temperature == 0 or self.std == 0:
            return self.inner.generate(prompts, params)
        dev = self.inner.device
        gen = torch.Generator(device=dev) if dev.type != "cpu" else torch.Generator()
        self._gen = gen.manual_seed(noise_seed(params.seed))
        try:
            return self.inner.generate(prompts, params)
        finally:
            self._gen = None

    def score(
        self, prompts: list[list[int]], completions: list[list[int]], temperature: float = 1.0
    ) -> list[list[float]]:
        return self.inner.score(prompts, completions, temperature)

    def update_weights(self, update: WeightUpdate) -> None:
        self.inner.update_weights(update)

    def close(self) -> None:
        self._hook.remove()
        self.inner.close()

    @property
    def device(self) -> torch.device:
        return self.inner.device
