"""Built-in sampler: transformers' Qwen3-MoE with a KV cache, batched, with the recipe's sampler numerics.

For tests and machines without vLLM. It is a separate engine from the trainer in the way that matters:
its own model copy in the sampler dtype (bf16), its own numerics (`recipe.sampler`), weights only
through `WeightUpdate`, and incremental decoding (one token per step against a KV cache) where the
trainer runs whole sequences.

Device: the model lives on `device` (default: where it is built). On CPU generation is transformers'
forward with a `DynamicCache`, one call per token; on CUDA it is `minite.engines.decode_loop.Decoder`: a
preallocated KV cache and the decode step replayed as a CUDA graph (one decoder per batch size, its
graph captured again after a weight update that replaced tensors). `decode_loop="static"` runs the
latter on any device (eager off CUDA), which is how tests check it on CPU. Sampling is seeded either way (a
generator on the model's device seeded with `SamplingParams.seed`), so a generation is reproducible on
the same device; CPU and CUDA draw different streams.

Temperature: at T > 0 a token is drawn from softmax(z / T) and the reported log-prob is that
distribution's, log_softmax(z / T), z the fp32 logits, both from the one tensor
`minite.engines.base.temper(z, T)`: the same fp32 division the trainer runs when it recomputes at T
(`Trainer(temperature=T)`), so an aligned recipe stays bit-identical at any T. Greedy decoding (T = 0,
evals) reports the untempered log_softmax(z) (minite.engines.base). `score` (teacher forcing) takes a
temperature too, 1 by default.

Routing record (`record_routing`, for routing replay): every MoE router appends the experts it chose at
each model call of `generate` (minite.nn.moe_layers.AlignedRouter.capture): the prefill routes every prompt
token, decode step s the token sampled at step s - 1. Each completion carries them as `routing`
(minite.engines.base.Completion), the prompt's real tokens first (left padding dropped). The device
loop runs eagerly while recording (a replayed CUDA graph would not run the routers' Python).
"""

from __future__ import annotations

import contextlib

import torch
from transformers import DynamicCache, PretrainedConfig, Qwen3MoeForCausalLM

from minite.engines.base import Completion, SamplingParams, WeightUpdate, temper
from minite.engines.decode_loop import Decoder
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
        device: torch.device | str | None = None,
        cuda_graphs: bool = True,
        max_len: int = 128,
        decode_loop: str = "auto",
    ) -> None:
        self.recipe = recipe
        self.dtype = dtype
        self.eos, self.pad = eos_token_id, pad_token_id
        config = config.__class__.from_dict(config.to_dict())
        config._attn_implementation = "sdpa"
        # built on the device directly (no host copy); None: wherever torch builds it
        place = torch.device(device) if device is not None else None
        with torch.device(place) if place is not None and place.type != "cpu" else contextlib.nullcontext():
            self.model = Qwen3MoeForCausalLM(config).to(dtype).eval()
            # `.to(bf16)` also rounds the rotary inv_freq buffers; inference engines (vLLM) and the
            # trainer keep them in fp32, so restore them (a diagnosis found this as a divergence at
            # attention)
            fresh = type(self.model.model.rotary_emb)(config)
        for name, buf in fresh.named_buffers():
            setattr(self.model.model.rotary_emb, name, buf)
        apply_numerics(self.model, recipe.sampler)
        self.device = next(self.model.parameters()).device
        if decode_loop not in ("auto", "dynamic", "static"):
            raise ValueError(
                f"BuiltinSampler: decode_loop must be auto, dynamic or static, got {decode_loop!r}"
            )
        # "static": minite.engines.decode_loop (auto: CUDA); "dynamic": transformers'
        # DynamicCache (auto: CPU)
        self.static = decode_loop == "static" or (decode_loop == "auto" and self.device.type == "cuda")
        self.cuda_graphs = cuda_graphs
        self.max_len = int(max_len)  # KV slots of a device decoder (grown when a call needs more)
        self._decoders: dict[int, Decoder] = {}  # device decode loops, one per batch size
        self.record_routing = record_routing
        self._moe_routers = [r for r in routers(self.model) if hasattr(r, "capture")]
        if record_routing and not self._moe_routers:
            raise ValueError(
                "BuiltinSampler: record_routing needs a model with MoE layers (routers), this one has none"
            )
        self.version = -1

    def update_weights(self, update: WeightUpdate) -> None:
        load_weights(self.model, update)
        self.version = update.version
        if self.device.type == "cuda" and self.recipe.sampler.quantized:
            # NVFP4 weights arrive as new tensors: graphs captured on the old ones are stale (the experts'
            # stacked copies in minite.kernels.moe are keyed by the live tensors and rebuild themselves)
            for dec in self._decoders.values():
                dec.release_graph()

    def close(self) -> None:
        self._decoders.clear()
        self.model = None

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        rows = [p for p in prompts for _ in range(params.n)]
        if self.device.type == "cpu":
            gen = torch.Generator().manual_seed(params.seed)
        else:
            gen = torch.Generator(device=self.device).manual_seed(params.seed)

        def choose(t: int, logits: torch.Tensor) -> torch.Tensor:
            # `logits`: already divided by the temperature (`_decode`), the logits of what is sampled
            if params.temperature == 0:
                return logits.argmax(-1)
            probs = torch.softmax(logits, dim=-1)
            return torch.multinomial(probs, 1, generator=gen).squeeze(-1)

        stops = {self.eos, *params.stop_token_ids}
        with self._capturing() as calls:
            tokens, logps, lengths = self._decode(
                rows, params.max_new_tokens, choose, stops, temperature=params.temperature
            )
        routing = self._routing_of(calls, rows, lengths) if calls is not None else None
        result: list[list[Completion]] = []
        for i, prompt in enumerate(prompts):
            group = []
            for j in range(params.n):
                r = i * params.n + j
                n_tok = int(lengths[r])
                toks = tokens[r, :n_tok].tolist()
                finished = bool(toks) and toks[-1] in stops
                c = Completion(prompt, toks, logps[r, :n_tok].tolist(), finished=finished)
                if routing is not None:
                    c.routing = routing[r]
                group.append(c)
            result.append(group)
        return result

    @contextlib.contextmanager
    def _capturing(self):
        """With `record_routing`: yields one list per MoE layer that collects its router's choices at
        every model call (minite.nn.moe_layers.AlignedRouter.capture); else yields None."""
        if not self.record_routing:
            yield None
            return
        calls: list[list[torch.Tensor]] = []
        for r in self._moe_routers:
            r.capture = []
            calls.append(r.capture)
        try:
            yield calls
        finally:
            for r in self._moe_routers:
                r.capture = None

    @staticmethod
    def _routing_of(
        calls: list[list[torch.Tensor]], rows: list[list[int]], lengths: torch.Tensor
    ) -> list[torch.Tensor]:
        """Per row, its routing record (len(prompt) + n_tokens - 1, n_moe_layers, k) int16: the prefill's
        rows at the prompt's real tokens (prompts are left-padded to width P), then decode call s's row
        (the token sampled at step s - 1) for the generated tokens that were fed back."""
        b, width = len(rows), max(len(p) for p in rows)
        prefill = torch.stack([c[0].view(b, width, -1) for c in calls], dim=2).cpu()  # (B, P, n, k)
        k = prefill.shape[-1]
        steps = [torch.stack([c[s] for c in calls], dim=1).cpu() for s in range(1, len(calls[0]))]
        decoded = torch.stack(steps, dim=1) if steps else torch.zeros((b, 0, len(calls), k), dtype=torch.long)
        out = []
        for r, prompt in enumerate(rows):
            fed = max(int(lengths[r]) - 1, 0)
            if fed > decoded.shape[1]:
                raise RuntimeError(f"routing record: {fed} fed tokens but {decoded.shape[1]} decode calls")
            rec = torch.cat((prefill[r, width - len(prompt) :], decoded[r, :fed]), dim=0)
            out.append(rec.to(torch.int16))
        return out

    @torch.no_grad()
    def score(
        self, prompts: list[list[int]], completions: list[list[int]], temperature: float = 1.0
    ) -> list[list[float]]:
        """Log-probs this engine assigns to given completions, computed exactly as during generation
        at `temperature` (incremental decoding against the KV cache, same batch layout): teacher-forced
        sampling."""
        width = max(1, max(len(c) for c in completions))
        forced = torch.full((len(completions), width), self.pad, dtype=torch.long)
        for i, c in enumerate(completions):
            forced[i, : len(c)] = torch.tensor(c, dtype=torch.long)
        forced = forced.to(self.device)

        def choose(t: int, logits: torch.Tensor) -> torch.Tensor:
            return forced[:, t]

        _, logps, _ = self._decode(
            prompts,
            width,
            choose,
            stops=set(),
            lengths_from=[len(c) for c in completions],
            temperature=temperature,
        )
        return [logps[i, : len(c)].tolist() for i, c in enumerate(completions)]

    def _decode(
        self,
        rows,
        max_new: int,
        choose,
        stops: set[int],
        lengths_from: list[int] | None = None,
        temperature: float = 1.0,
    ):
        """Batched incremental decoding. Returns tokens (B, T), their log-probs (B, T), lengths (B,).
        `choose(t, z)` picks step t's tokens from the tempered fp32 logits z (module docstring), whose
        log-softmax gives the log-probs."""
        if self.version < 0:
            raise RuntimeError("BuiltinSampler: no weights loaded yet (call update_weights first)")
        if self.static:
            return self._decode_device(rows, max_new, choose, stops, lengths_from, temperature)
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
            logits = temper(logits, temperature)
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

    def _decoder(self, batch: int, slots: int) -> Decoder:
        """The device decode loop for this batch size, with at least `slots` KV slots."""
        dec = self._decoders.get(batch)
        if dec is None or dec.max_len < slots:
            self._decoders.pop(batch, None)  # its cache and graph go before the new ones are allocated
            size = max(self.max_len, -(-slots // 32) * 32)
            dec = self._decoders[batch] = Decoder(self.model, batch, size, self.device)
        return dec

    def _decode_device(
        self,
        rows,
        max_new: int,
        choose,
        stops: set[int],
        lengths_from: list[int] | None,
        temperature: float = 1.0,
    ):
        """`_decode` on the model's device (CUDA): minite.engines.decode_loop.Decoder. Returns CPU tensors."""
        ids, mask = left_pad(rows, self.pad)
        dec = self._decoder(ids.shape[0], ids.shape[1] + max_new - 1)
        tokens, logps, lengths = dec.decode(
            ids.to(self.device),
            mask.to(self.device),
            max_new,
            choose,
            pad=self.pad,
            stops=stops,
            limit=lengths_from,
            # a replayed graph skips the routers' Python, which records the routing
            use_graph=self.cuda_graphs and self.device.type == "cuda" and not self.record_routing,
            temperature=temperature,
        )
        return tokens.cpu(), logps.cpu(), lengths.cpu()
