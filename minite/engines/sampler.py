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
        # `.to(bf16)` also rounds the rotary inv_freq buffers; inference engines (vLLM) and the trainer
        # keep them in fp32, so restore them (a diagnosis found this as a divergence at attention)
        fresh = type(self.model.model.rotary_emb)(config)
        for name, buf in fresh.named_buffers():
            setattr(self.model.model.rotary_emb, name, buf)
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
        rows = [p for p in prompts for _ in range(params.n)]
        gen = torch.Generator().manual_seed(params.seed)

        def choose(t: int, logits: torch.Tensor) -> torch.Tensor:
            if params.temperature == 0:
                return logits.argmax(-1)
            probs = torch.softmax(logits / params.temperature, dim=-1)
            return torch.multinomial(probs, 1, generator=gen).squeeze(-1)

        stops = {self.eos, *params.stop_token_ids}
        tokens, logps, lengths = self._decode(rows, params.max_new_tokens, choose, stops)
        result: list[list[Completion]] = []
        for i, prompt in enumerate(prompts):
            group = []
            for j in range(params.n):
                r = i * params.n + j
                n_tok = int(lengths[r])
                toks = tokens[r, :n_tok].tolist()
                finished = bool(toks) and toks[-1] in stops
                group.append(Completion(prompt, toks, logps[r, :n_tok].tolist(), finished=finished))
            result.append(group)
        return result

    @torch.no_grad()
    def score(self, prompts: list[list[int]], completions: list[list[int]]) -> list[list[float]]:
        """Log-probs this engine assigns to given completions, computed exactly as during generation
        (incremental decoding against the KV cache, same batch layout): teacher-forced sampling."""
        width = max(1, max(len(c) for c in completions))
        forced = torch.full((len(completions), width), self.pad, dtype=torch.long)
        for i, c in enumerate(completions):
            forced[i, : len(c)] = torch.tensor(c, dtype=torch.long)

        def choose(t: int, logits: torch.Tensor) -> torch.Tensor:
            return forced[:, t]

        _, logps, _ = self._decode(
            prompts, width, choose, stops=set(), lengths_from=[len(c) for c in completions]
        )
        return [logps[i, : len(c)].tolist() for i, c in enumerate(completions)]

    def _decode(self, rows, max_new: int, choose, stops: set[int], lengths_from: list[int] | None = None):
        """Batched incremental decoding. Returns tokens (B, T), their log-probs (B, T), lengths (B,)."""
        if self.version < 0:
            raise RuntimeError("BuiltinSampler: no weights loaded yet (call update_weights first)")
        ids, mask = left_pad(rows, self.pad)
        b = ids.shape[0]
        cache = DynamicCache()
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out_tokens = torch.full((b, max_new), self.pad, dtype=torch.long)
        out_logp = torch.zeros((b, max_new), dtype=torch.float32)
        done = torch.zeros(b, dtype=torch.bool)
        lengths = torch.zeros(b, dtype=torch.long)
        limit = torch.tensor(lengths_from) if lengths_from is not None else None
        step_ids, step_pos = ids, pos
        for t in range(max_new):
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
            if not bool(torch.isfinite(logits).all()):
                from minite.engines.faults import NonFiniteError

                rows_bad = (~torch.isfinite(logits)).any(-1).nonzero().flatten().tolist()
                raise NonFiniteError(
                    {
                        "kind": "activation",
                        "site": "sampler logits",
                        "tensor": f"rows {rows_bad[:8]} at decode step {t}",
                    }
                )
            logp = torch.log_softmax(logits, dim=-1)
            tok = choose(t, logits)
            if limit is not None:
                done = t >= limit
            tok = torch.where(done, torch.full_like(tok, self.pad), tok)
            out_tokens[:, t] = tok
            out_logp[:, t] = logp.gather(-1, tok[:, None]).squeeze(-1)
            lengths += (~done).long()
            if stops:
                done |= torch.tensor([int(x) in stops for x in tok.tolist()])
            if bool(done.all()) or (limit is not None and t + 1 >= int(limit.max())):
                break
            step_ids = tok[:, None]
            step_pos = step_pos[:, -1:] + 1
            mask = torch.cat((mask, torch.ones((b, 1), dtype=mask.dtype)), dim=1)
        return out_tokens, out_logp, lengths
