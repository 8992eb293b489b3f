"""Built-in sampler: transformers' Qwen3-MoE with a KV cache, batched, with the recipe's sampler numerics.

For tests and machines without vLLM. It is a separate engine from the trainer in the way that matters:
its own model copy in the sampler dtype (bf16), its own numerics (`recipe.sampler`), weights only
through `WeightUpdate`, and incremental decoding (one token per step against a KV cache) where the
trainer runs whole sequences.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PretrainedConfig, Qwen3MoeForCausalLM

from minite.engines.base import Completion, SamplingParams, WeightUpdate
from minite.engines.weight_sync import load_weights
from minite.nn.swap import apply_numerics, routers
from minite.recipes import Recipe


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, P) ids and attention mask, prompts right-aligned so every row decodes at the same column."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids, mask


class BuiltinSampler:
    def __init__(
        self,
        config: PretrainedConfig,
        recipe: Recipe,
        *,
        dtype: torch.dtype = torch.bfloat16,
        eos_token_id: int,
        pad_token_id: int,
        record_routing: bool = False,
    ) -> None:
        self.recipe = recipe
        self.dtype = dtype
        self.eos, self.pad = eos_token_id, pad_token_id
        config = config.__class__.from_dict(config.to_dict())
        config._attn_implementation = "sdpa"
        self.model = Qwen3MoeForCausalLM(config).to(dtype).eval()
        apply_numerics(self.model, recipe.sampler)
        self.record_routing = record_routing
        for r in routers(self.model):
            if hasattr(r, "record"):
                r.record = record_routing
        self.version = -1

    def update_weights(self, update: WeightUpdate) -> None:
        load_weights(self.model, update)
        self.version = update.version

    def close(self) -> None:
        self.model = None

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        if self.version < 0:
            raise RuntimeError("BuiltinSampler.generate: no weights loaded yet (call update_weights first)")
        rows = [p for p in prompts for _ in range(params.n)]
        ids, mask = left_pad(rows, self.pad)
        b = ids.shape[0]
        gen = torch.Generator().manual_seed(params.seed)
        stops = {self.eos, *params.stop_token_ids}
        cache = DynamicCache()
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out_tokens = torch.full((b, params.max_new_tokens), self.pad, dtype=torch.long)
        out_logp = torch.zeros((b, params.max_new_tokens), dtype=torch.float32)
        done = torch.zeros(b, dtype=torch.bool)
        lengths = torch.zeros(b, dtype=torch.long)
        step_ids, step_pos = ids, pos
        for t in range(params.max_new_tokens):
            logits = (
                self.model(
                    input_ids=step_ids,
                    attention_mask=mask,
                    position_ids=step_pos,
                    past_key_values=cache,
                    use_cache=True,
                )
                .logits[:, -1]
                .float()
            )
            logp = torch.log_softmax(logits, dim=-1)
            if params.temperature == 0:
                tok = logits.argmax(-1)
            else:
                probs = torch.softmax(logits / params.temperature, dim=-1)
                tok = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
            tok = torch.where(done, torch.full_like(tok, self.pad), tok)
            out_tokens[:, t] = tok
            out_logp[:, t] = logp.gather(-1, tok[:, None]).squeeze(-1)
            lengths += (~done).long()
            done |= torch.tensor([int(x) in stops for x in tok.tolist()])
            if bool(done.all()):
                break
            step_ids = tok[:, None]
            step_pos = step_pos[:, -1:] + 1
            mask = torch.cat((mask, torch.ones((b, 1), dtype=mask.dtype)), dim=1)
        result: list[list[Completion]] = []
        for i, prompt in enumerate(prompts):
            group = []
            for j in range(params.n):
                r = i * params.n + j
                n_tok = int(lengths[r])
                toks = out_tokens[r, :n_tok].tolist()
                group.append(
                    Completion(
                        prompt, toks, out_logp[r, :n_tok].tolist(), finished=bool(toks) and toks[-1] in stops
                    )
                )
            result.append(group)
        return result
