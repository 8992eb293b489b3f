"""The interface every sampler engine implements (built-in and vLLM).

A sampler generates completions for token-id prompts and reports the log-prob *it* assigned to each
token it sampled; the trainer later recomputes the same log-probs with its own numerics, and the
difference is the execution gap miniTE measures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch


@dataclass
class Completion:
    prompt_ids: list[int]
    token_ids: list[int]  # generated tokens, eos included when generation stopped on it
    logprobs: list[float]  # sampler log-prob of each generated token (same length as token_ids)
    finished: bool  # stopped on eos (False: hit max_new_tokens)
    # Optional MoE routing record: per generated token, per layer, the selected expert ids.
    routing: list[list[list[int]]] | None = None


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
