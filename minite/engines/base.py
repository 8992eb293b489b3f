"""The interface every sampler engine implements (built-in and vLLM).

A sampler generates completions for token-id prompts and reports the log-prob *it* assigned to each
token it sampled; the trainer later recomputes the same log-probs with its own numerics, and the
difference is the execution gap miniTE measures.

Temperature. A sampler at temperature T > 0 draws token x from softmax(z / T), z the fp32 logits, so
the log-prob it reports is that distribution's,

    log π_T(x) = z_x / T − logsumexp(z / T),

and the trainer recomputes the same quantity (`Trainer(temperature=T)`): the PPO ratio and the
importance weights (TIS, MIS, Geo-RS) compare the policy the trainer differentiates with the
distribution the tokens were actually drawn from. Both sides take the tempered logits from `temper`
(one IEEE fp32 division by T, the division vLLM's sampler does, skipped at T = 1 so those bits are the
untempered ones), so a recipe whose logits agree bit for bit keeps log-probs that agree bit for bit at
any T. Greedy decoding
(T = 0, evals only) reports the untempered log-softmax: argmax has no distribution to temper, and
nothing trains on those log-probs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch


def temper(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """fp32 `logits` / `temperature`: the logits of the distribution sampled at that temperature. At
    1.0 (and at 0, greedy: module docstring) the logits themselves, not divided, so their bits are
    those of the untempered path."""
    if temperature in (0.0, 1.0):
        return logits
    if not temperature > 0:
        raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature}")
    # a true division by T rounded to the logits' dtype, as vLLM's sampler divides (by a per-request
    # float32 tensor). Dividing by the Python float would differ on CUDA, where PyTorch turns division
    # by a host scalar into multiplication by its rounded reciprocal.
    return logits / torch.full((), float(temperature), dtype=logits.dtype, device=logits.device)


def logprob_temperature(temperature: float) -> float:
    """The temperature of the log-probs a sampler reports when it samples at `temperature`: T itself,
    or 1 for greedy decoding (T = 0, module docstring). A recompute meant to equal them uses it."""
    if not 0 <= temperature < float("inf"):  # NaN fails every comparison
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature}")
    return float(temperature) if temperature > 0 else 1.0


@dataclass
class Completion:
    prompt_ids: list[int]
    token_ids: list[int]  # generated tokens, eos included when generation stopped on it
    logprobs: list[float]  # sampler log-prob of each generated token (same length as token_ids)
    finished: bool  # stopped on eos (False: hit max_new_tokens)
    # the MoE routing record (routing replay; `BuiltinSampler(record_routing=True)`): int16
    # (len(prompt_ids) + len(token_ids) - 1, n_moe_layers, k), the experts the sampler routed each token
    # of prompt + completion to, in order; the last sampled token is never fed back, so it has none
    routing: torch.Tensor | None = None


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1  # completions per prompt (GRPO group size)
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)


@dataclass
class WeightUpdate:
    """What crosses from trainer to sampler at a sync: HF-checkpoint-named tensors.

    Plain entries are high-precision weights (`<module>.weight`). A quantized linear appears as three
    entries under its module prefix (the trainer's exact forward weights, or a re-export):
        <module>.qweight              uint8 (N, K/2)   packed E2M1, even element in the low nibble
        <module>.weight_scale         float8_e4m3fn (N, K/16)
        <module>.weight_global_scale  float32 ()       encode scale s_enc
    MoE experts use per-expert names (`mlp.experts.<e>.gate_proj`, `up_proj`, `down_proj`), as in HF
    Qwen3-MoE checkpoints.
    """

    tensors: dict[str, torch.Tensor]
    version: int = 0


class Sampler(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """One list of `params.n` completions per prompt, in prompt order."""
        ...

    def update_weights(self, update: WeightUpdate) -> None:
        """Load new weights in place, without restarting the engine."""
        ...

    def close(self) -> None: ...
