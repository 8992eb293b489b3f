"""The device decode loop of the built-in sampler (and of `minite bench rollout`).

Every tensor stays on the device: a preallocated KV cache (`StaticKVCache`), a 4-D boolean attention
mask over its slots, static input buffers, and, on CUDA, the decode step captured once as a CUDA graph
and replayed (transformers' forward launches hundreds of small kernels per layer; replaying removes
the host from the loop). Sampling (softmax + multinomial, or argmax) runs outside the graph.

Layout: prompts right-aligned (left padding) in slots [0, P); generated token t goes to slot P + t.
Positions count real prompt tokens only (position of a row's first generated token = its prompt
length), as `minite.engines.sampler` does on CPU and the trainer does on right-padded sequences, so
every engine gives a token the same position. Pad slots are hidden from every real query; a pad query
attends to its own slot only (finite values, never read back). The cache also hands each row's window to
attention="fixed" (`StaticKVCache.attention_window`: first real slot, first query slot), whose kernels
need no mask; there a pad query sees nothing and gives 0.

A graph reads the weights at the addresses it was captured with: whoever replaces weight tensors (a
`WeightUpdate` with NVFP4 bytes) must drop the graph (`release_graph`), and the next step captures it
again after an eager warm-up step.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache


class StaticKVCache(Cache):
    """A preallocated KV cache for transformers' attention modules: `update` writes the new keys/values
    at `write_pos` (a device scalar the decode loop sets before each step, so a captured graph writes
    where the loop says) and returns the whole buffers; the 4-D mask hides the unwritten slots."""

    def __init__(self, layers, batch, kv_heads, head_dim, max_len, dtype, device) -> None:  # noqa: D107
        # transformers' own layer objects are not used: only `update` is called by the attention
        self.layers = []
        self.offloading = False
        self.max_len = int(max_len)
        shape = (batch, kv_heads, self.max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.write_pos = torch.zeros((), dtype=torch.long, device=device)
        # the attention window of each row (attention="fixed", minite.nn.attention_fixed): its first real
        # key slot (the left padding) and the slot of this step's first query (write_pos; an int while it
        # is known on the host, a device tensor in the captured decode step)
        self.kv_start = torch.zeros((batch,), dtype=torch.int32, device=device)
        self.q_start = torch.zeros((batch,), dtype=torch.int32, device=device)
        self.q_start_host: int | None = 0
        self.seen = 0
        self._idx: torch.Tensor | None = None

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        # the slots of this step, computed by the first layer and reused by the others (two launches a
        # layer fewer; layer 0 runs first in every step, eager or captured)
        if layer_idx == 0 or self._idx is None or self._idx.numel() != key_states.shape[-2]:
            self._idx = self.write_pos + torch.arange(key_states.shape[-2], device=key_states.device)
        idx = self._idx
        self.k[layer_idx].index_copy_(2, idx, key_states)
        self.v[layer_idx].index_copy_(2, idx, value_states)
        return self.k[layer_idx], self.v[layer_idx]

    def fused_write_target(self, layer_idx: int, key_states, value_states):
        """(k buffer, v buffer, write_pos) for an attention that writes this step's keys/values itself
        (minite.nn.aligned_attention's fused q/k path: the slots written are write_pos + l, as `update` writes
        them), or None if these states do not fit the buffers (then it calls `update`)."""
        k, v = self.k[layer_idx], self.v[layer_idx]
        # states (B, L, Hkv, d) against buffers (B, Hkv, S, d)
        b, seq, hkv, d = key_states.shape
        fits = (b, hkv, d) == (k.shape[0], k.shape[1], k.shape[3]) and key_states.dtype == k.dtype
        if not fits or value_states.shape != key_states.shape or value_states.dtype != v.dtype:
            return None
        if layer_idx == 0:
            self._idx = None  # a later layer that calls `update` computes this step's slots afresh
        return k, v, self.write_pos

    def set_window(self, write_pos: int, kv_start: torch.Tensor | None = None, host: bool = False) -> None:
        """This step's slots: queries from `write_pos` on; `kv_start` (B,) the rows' first real slots (set
        at the prefill; None keeps them). host: the attention may read write_pos as a host int (not in a
        step a CUDA graph replays)."""
        self.write_pos.fill_(write_pos)
        self.q_start.fill_(write_pos)
        self.q_start_host = int(write_pos) if host else None
        if kv_start is not None:
            self.kv_start.copy_(kv_start)

    def attention_window(self) -> tuple[torch.Tensor, torch.Tensor | int]:
        """(kv_start (B,), q_start): every row's query l sees the slots [kv_start, q_start + l]."""
        return self.kv_start, self.q_start if self.q_start_host is None else self.q_start_host

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return self.max_len

    def get_mask_sizes(self, *args, **kwargs) -> tuple[int, int]:
        return self.max_len, 0

    @property
    def is_compileable(self) -> bool:
        return True


class Decoder:
    """Batched decoding of one model on its device (module docstring): prefill, then one step per token.

    One Decoder serves one batch size and at most `max_len` slots (prompt + generated tokens)."""

    def __init__(self, model, batch: int, max_len: int, device: torch.device) -> None:
        cfg = model.config
        self.model, self.batch, self.max_len, self.device = model, batch, max_len, device
        dtype = next(model.parameters()).dtype
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.kv = StaticKVCache(
            cfg.num_hidden_layers, batch, cfg.num_key_value_heads, head_dim, max_len, dtype, device
        )
        self.ids = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.pos = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.mask = torch.zeros((batch, 1, 1, max_len), dtype=torch.bool, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.graph_logits: torch.Tensor | None = None
        self.graph_error: str | None = None  # a capture failed: this decoder runs eager from then on
        self.captures = 0

    def _forward(self, ids, pos, mask) -> torch.Tensor:
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            past_key_values=self.kv,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1]

    @torch.no_grad()
    def prefill(self, prompt: torch.Tensor, real: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of the last prompt position. prompt (B, P), right-aligned; real (B, P): 1/True at
        prompt tokens, 0 at left padding (None: no padding)."""
        b, p = prompt.shape
        if p > self.max_len:
            raise ValueError(f"Decoder: prompt width {p} exceeds the cache's {self.max_len} slots")
        self.mask.zero_()
        j = torch.arange(self.max_len, device=self.device)
        i = torch.arange(p, device=self.device)
        causal = j[None, :] <= i[:, None]  # (P, S)
        if real is None:
            keep = causal.expand(b, 1, p, -1)
            pos = i.expand(b, -1)
            self.mask[..., :p] = True
            self.kv.set_window(0, torch.zeros(b, dtype=torch.int32, device=self.device), host=True)
        else:
            real = real.to(device=self.device, dtype=torch.bool)
            # right-aligned prompts: a row's first real slot is its number of padding slots
            self.kv.set_window(0, (~real).sum(-1).to(torch.int32), host=True)
            key_real = F.pad(real, (0, self.max_len - p))  # (B, S)
            own = j[None, :] == i[:, None]  # a pad query sees its own slot only
            keep = (causal[None] & (key_real[:, None, :] | own[None]))[:, None]  # (B, 1, P, S)
            pos = (real.long().cumsum(-1) - 1).clamp(min=0)
            self.mask[:, 0, 0, :p] = real
        return self._forward(prompt, pos, keep)

    @torch.no_grad()
    def step_eager(self) -> torch.Tensor:
        return self._forward(self.ids, self.pos, self.mask)

    @torch.no_grad()
    def capture(self, warmup: int = 2) -> None:
        """Record the decode step as a CUDA graph (after `warmup` eager steps on a side stream, which
        compile kernels and refresh weight caches; they recompute the current step, so the cache
        slot they write is written again, identically, by the replay)."""
        self.release_graph()
        with torch.cuda.device(self.device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    self.step_eager()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.graph_logits = self.step_eager()
        self.graph = graph
        self.captures += 1

    def try_capture(self) -> bool:
        """`capture`, reporting a failure once (then this decoder runs eager)."""
        if self.graph is not None:
            return True
        if self.graph_error is not None:
            return False
        try:
            self.capture(warmup=2 if self.captures == 0 else 1)
        except Exception as exc:  # noqa: BLE001 - any capture failure: run eager, say why once
            self.release_graph()
            self.graph_error = f"{type(exc).__name__}: {exc}"[:500]
            warnings.warn(
                f"Decoder: CUDA graph capture failed, decoding eagerly: {self.graph_error}", stacklevel=2
            )
            return False
        return True

    def release_graph(self) -> None:
        self.graph = None
        self.graph_logits = None

    def step(self, use_graph: bool) -> torch.Tensor:
        if use_graph and self.graph is not None:
            self.graph.replay()
            return self.graph_logits
        return self.step_eager()

    def set_next(self, tokens: torch.Tensor, position: int, positions: torch.Tensor | None = None) -> None:
        """Feed `tokens` (B,) into slot `position`; their positions are `positions` (B,) or, when None
        (no padding), `position`."""
        self.ids.copy_(tokens[:, None])
        if positions is None:
            self.pos.fill_(position)
        else:
            self.pos.copy_(positions[:, None])
        self.kv.set_window(position)
        self.mask[..., position] = True

    @torch.no_grad()
    def decode(
        self,
        prompt: torch.Tensor,
        real: torch.Tensor | None,
        max_new: int,
        choose: Callable[[int, torch.Tensor], torch.Tensor],
        *,
        pad: int,
        stops: set[int] | frozenset[int] = frozenset(),
        limit: list[int] | None = None,
        use_graph: bool = True,
        temperature: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The built-in sampler's loop on the device: tokens (B, T), their fp32 log-probs (B, T) and
        lengths (B,), on the device. `choose(t, logits)` picks step t's tokens from fp32 logits (B, V);
        a row stops after a token in `stops` (kept) or after `limit[row]` tokens (teacher forcing);
        stopped rows emit `pad`. Non-finite logits raise NonFiniteError naming rows and step. The
        logits `choose` sees and the log-probs are those divided by `temperature`
        (minite.engines.base.temper: the distribution sampled from)."""
        from minite.engines.base import temper
        from minite.engines.faults import NonFiniteError

        b, p = prompt.shape
        if p + max_new > self.max_len + 1:  # the last token is sampled, never fed back
            raise ValueError(f"Decoder: {p} + {max_new} tokens exceed the cache's {self.max_len} slots")
        dev = self.device
        logits = self.prefill(prompt, real)
        tokens = torch.full((b, max_new), pad, dtype=torch.long, device=dev)
        logps = torch.zeros((b, max_new), dtype=torch.float32, device=dev)
        done = torch.zeros(b, dtype=torch.bool, device=dev)
        lengths = torch.zeros(b, dtype=torch.long, device=dev)
        stop_ids = torch.tensor(sorted(stops), dtype=torch.long, device=dev) if stops else None
        lim = torch.tensor(limit, dtype=torch.long, device=dev) if limit is not None else None
        t_end = min(max_new, max(limit)) if limit is not None else max_new
        first = real.to(dev).long().sum(-1) if real is not None else torch.full((b,), p, device=dev)
        for t in range(max_new):
            logits = logits.float()
            finite = torch.isfinite(logits).all(-1)
            # multinomial on NaN probabilities is a device-side assert on CUDA: sample from zeros
            # there, and raise below with the rows (the CPU loop raises before sampling)
            safe = temper(torch.where(finite[:, None], logits, torch.zeros((), device=dev)), temperature)
            logp = torch.log_softmax(safe, dim=-1)
            tok = choose(t, safe)
            if lim is not None:
                done = t >= lim
            tok = torch.where(done, torch.full_like(tok, pad), tok)
            tokens[:, t] = tok
            logps[:, t] = logp.gather(-1, tok[:, None]).squeeze(-1)
            lengths += (~done).long()
            if stop_ids is not None:
                done = done | torch.isin(tok, stop_ids)
            all_done, any_bad = torch.stack((done.all(), ~finite.all())).tolist()  # one sync per step
            if any_bad:
                rows_bad = (~finite).nonzero().flatten().tolist()
                raise NonFiniteError(
                    {
                        "kind": "activation",
                        "site": "sampler logits",
                        "tensor": f"rows {rows_bad[:8]} at decode step {t}",
                    }
                )
            if all_done or t + 1 >= t_end:
                break
            self.set_next(tok, p + t, first + t)
            if use_graph and dev.type == "cuda":
                use_graph = self.try_capture()
            logits = self.step(use_graph)
        return tokens, logps, lengths

    @torch.no_grad()
    def generate(
        self, prompt: torch.Tensor, new_tokens: int, gen: torch.Generator, clock: Any, use_graph: bool
    ) -> dict[str, Any]:
        """Benchmark loop (`minite bench rollout`): sample `new_tokens` per row at temperature 1, no
        EOS, prompts without padding; returns the tokens and the prefill / decode times. `clock`:
        `minite.bench.throughput.Clock` (mark / sync / elapsed_ms)."""
        p = prompt.shape[1]
        out = torch.empty((self.batch, new_tokens), dtype=torch.long, device=self.device)
        a = clock.mark()
        logits = self.prefill(prompt)
        b = clock.mark()
        for t in range(new_tokens):
            probs = torch.softmax(logits.float(), dim=-1)
            tok = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
            out[:, t] = tok
            if t == new_tokens - 1:
                break
            self.set_next(tok, p + t)
            logits = self.step(use_graph)
        c = clock.mark()
        clock.sync()
        return {"tokens": out, "prefill_ms": clock.elapsed_ms(a, b), "decode_ms": clock.elapsed_ms(b, c)}
