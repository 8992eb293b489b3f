"""Warm-start SFT of the tiny model to *partial* competence on the arithmetic task.

Why partial: RL from a random model gets no reward signal, and RL from a solved task has nothing
left to learn; both hide the effect the benchmark measures. So SFT trains on (prompt, answer) pairs,
evaluates greedy exact-match accuracy on a held-out slice of the training split every few steps,
and stops once accuracy has entered a configurable band (default 25-60 %) on `evals_in_band`
consecutive evaluations.

Loss: cross-entropy on the completion tokens only (answer characters + <eos>); prompt and padding
positions are masked out, matching what the RL policy is later scored on.

Determinism: parameters come from the caller; batches come from a `torch.Generator` seeded with
`cfg.seed`; there is no dropout; every op used (CPU matmul, `index_add_`, cross-entropy) is
deterministic for a fixed thread count, so two runs with the same seed give bit-identical weights.

Device (`SFTConfig.device`, `prepare.sft.device` in a profile: auto | cpu | cuda | cuda:N): the model,
its optimizer state and every batch live there; batch order still comes from the CPU generator. On
CUDA the experts run transformers' grouped_mm where torch's grouped GEMM trains in fp32 (else, and on
CPU, the eager per-expert loop), fp32 matmuls may use TF32, and results are reproducible only up to GPU
reduction order.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from minite.engines.device import check_device, resolve_device
from minite.models.tokenizer import encode_completion, encode_prompt
from minite.rl.completion_formats import score
from minite.rl.task import Example


@dataclass(frozen=True)
class SFTConfig:
    """SFT knobs. Accuracy is greedy exact match on the last `n_holdout` training examples.

    Training stops after `evals_in_band` consecutive evaluations at or above `acc_band[0]`: a single
    eval is noisy (the model oscillates by several points between evals), and stopping on one lucky
    eval leaves a model below the band on fresh data.

    `num_threads` pins torch's intra-op threads for the run (restored afterwards): results are
    bitwise reproducible only for a fixed thread count, and on a shared 2-core machine one thread is
    several times faster than two fighting over busy cores (measured 55 vs 350 ms per step).

    `max_time_s` is an optional wall-clock safety stop; when it fires (stop_reason "max_time") the
    result depends on machine speed and is not reproducible, so it is off by default and the
    run is bounded by `max_steps` instead.

    `device`: where the model trains (module docstring); `auto` is cuda when torch sees a GPU.
    """

    seed: int = 0
    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    warmup_steps: int = 20
    grad_clip: float = 1.0
    batch_size: int = 64
    max_steps: int = 1500
    eval_every: int = 20
    n_holdout: int = 512
    acc_band: tuple[float, float] = (0.25, 0.6)
    evals_in_band: int = 2
    max_time_s: float | None = None
    num_threads: int = 1
    progress: bool = True
    device: str = "auto"

    def __post_init__(self) -> None:
        check_device(self.device)
        lo, hi = self.acc_band
        if not 0.0 <= lo <= hi <= 1.0:
            raise ValueError(f"acc_band must satisfy 0 <= low <= high <= 1, got {self.acc_band}")
        if self.batch_size < 1 or self.max_steps < 0 or self.eval_every < 1 or self.evals_in_band < 1:
            raise ValueError("batch_size, eval_every and evals_in_band must be >= 1, max_steps >= 0")
        object.__setattr__(self, "betas", tuple(self.betas))
        object.__setattr__(self, "acc_band", tuple(self.acc_band))


def make_batch(
    tokenizer: PreTrainedTokenizerBase, examples: Sequence[Example]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (input_ids, attention_mask, loss_mask); loss_mask marks completion tokens.

    loss_mask[b, t] = 1 when token t is part of the completion, i.e. predicted from position t-1.
    """
    seqs, n_prompt = [], []
    for ex in examples:
        p = encode_prompt(tokenizer, ex.prompt)
        seqs.append(p + encode_completion(tokenizer, ex.completion))
        n_prompt.append(len(p))
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    loss_mask = torch.zeros((len(seqs), width), dtype=torch.float32)
    for i, (s, n) in enumerate(zip(seqs, n_prompt, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        loss_mask[i, n : len(s)] = 1.0
    return ids, attn, loss_mask


def _device_of(model: PreTrainedModel) -> torch.device:
    return next(model.parameters()).device


def _grouped_mm_trains(device: torch.device, dtype: torch.dtype) -> bool:
    """Does torch's grouped GEMM run forward and backward for `dtype` on this CUDA device?"""
    fn = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
    if fn is None:
        return False
    try:
        x = torch.ones((32, 16), device=device, dtype=dtype, requires_grad=True)
        w = torch.ones((2, 16, 16), device=device, dtype=dtype, requires_grad=True)
        fn(x, w, offs=torch.tensor([16, 32], device=device, dtype=torch.int32)).sum().backward()
        torch.cuda.synchronize(device)
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    return True


def place_model(model: PreTrainedModel, device: torch.device) -> PreTrainedModel:
    """Move `model` to `device` with the experts implementation that suits it: transformers' grouped_mm
    on CUDA when torch's grouped GEMM trains in the model's dtype there, else the eager per-expert loop
    (what `build_tiny_model` sets, and always on CPU)."""
    model.to(device)
    if hasattr(model, "set_experts_implementation"):
        dtype = next(model.parameters()).dtype
        grouped = device.type == "cuda" and _grouped_mm_trains(device, dtype)
        model.set_experts_implementation("grouped_mm" if grouped else "eager")
    return model


def completion_loss(model: PreTrainedModel, ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor):
    """Mean next-token cross-entropy over completion positions (inputs moved to the model's device)."""
    dev = _device_of(model)
    ids, attn, mask = ids.to(dev), attn.to(dev), mask.to(dev)
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    target, m = ids[:, 1:], mask[:, 1:]
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none")
    return (nll * m.reshape(-1)).sum() / m.sum()


@torch.no_grad()
def greedy_complete(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    max_new_tokens: int,
    batch_size: int = 256,
) -> list[str]:
    """Greedy completions (decoded, special tokens removed, cut at <eos>).

    Prompts are grouped by token length so batches need no padding (no position/mask subtleties);
    the full sequence is recomputed each step (sequences are a dozen tokens, no KV cache needed).
    """
    was_training = model.training
    model.eval()
    eos = tokenizer.eos_token_id
    dev = _device_of(model)
    by_len: dict[int, list[int]] = defaultdict(list)
    encoded = [encode_prompt(tokenizer, p) for p in prompts]
    for i, e in enumerate(encoded):
        by_len[len(e)].append(i)
    out: list[str] = [""] * len(prompts)
    for _, idx in sorted(by_len.items()):
        for start in range(0, len(idx), batch_size):
            chunk = idx[start : start + batch_size]
            ids = torch.tensor([encoded[i] for i in chunk], dtype=torch.long, device=dev)
            n0 = ids.shape[1]
            done = torch.zeros(len(chunk), dtype=torch.bool, device=dev)
            for _ in range(max_new_tokens):
                nxt = model(input_ids=ids).logits[:, -1].argmax(-1)
                ids = torch.cat([ids, nxt[:, None]], dim=1)
                done |= nxt == eos
                if bool(done.all()):
                    break
            for row, i in zip(ids[:, n0:].tolist(), chunk, strict=True):
                if eos in row:
                    row = row[: row.index(eos)]
                out[i] = tokenizer.decode(row, skip_special_tokens=True)
    model.train(was_training)
    return out


def accuracy(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, examples: Sequence[Example]
) -> float:
    """Greedy accuracy (mean `formats.score`: exact match of the answer, by the example's format)."""
    if not examples:
        return float("nan")
    max_new = max(len(ex.completion) for ex in examples) + 1
    comps = greedy_complete(model, tokenizer, [ex.prompt for ex in examples], max_new)
    return sum(score(ex, c) for c, ex in zip(comps, examples, strict=True)) / len(examples)


def sft(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train_examples: Sequence[Example],
    cfg: SFTConfig,
) -> dict[str, Any]:
    """Train in place until held-out accuracy reaches `cfg.acc_band[0]` (or a step/time limit), on
    `cfg.device` (the model is moved there and stays there).

    Returns metrics: acc_before/acc_after (held-out slice), in_band, steps, stop_reason, losses,
    eval history and wall time.
    """
    t0 = time.perf_counter()
    device = resolve_device(cfg.device, "prepare.sft.device")
    if _device_of(model) != device:
        place_model(model, device)
    prev_threads = torch.get_num_threads()
    prev_precision = torch.get_float32_matmul_precision()
    torch.set_num_threads(cfg.num_threads)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 tensor cores for the fp32 model (GPU only)
    try:
        return _sft(model, tokenizer, train_examples, cfg, t0)
    finally:
        torch.set_num_threads(prev_threads)
        torch.set_float32_matmul_precision(prev_precision)


def _sft(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train_examples: Sequence[Example],
    cfg: SFTConfig,
    t0: float,
) -> dict[str, Any]:
    n_hold = min(cfg.n_holdout, len(train_examples) // 2)
    holdout = list(train_examples[len(train_examples) - n_hold :])
    train = list(train_examples[: len(train_examples) - n_hold])
    if not train:
        raise ValueError("sft needs at least one training example after the held-out slice")
    lo, hi = cfg.acc_band

    gen = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    foreach = _device_of(model).type == "cuda"  # CPU: per-tensor loops (bitwise reproducible as before)
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, foreach=foreach
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, cfg.warmup_steps)))

    acc0 = accuracy(model, tokenizer, holdout) if holdout else float("nan")
    history: list[dict[str, float | None]] = [{"step": 0, "acc": acc0}]
    losses: list[float] = []
    acc, step, stop_reason, streak = acc0, 0, "max_steps", 0
    if holdout and acc0 >= lo:
        stop_reason = "already_in_band" if acc0 <= hi else "above_band"
    else:
        model.train()
        perm, pos = torch.randperm(len(train), generator=gen), 0
        bar = tqdm(total=cfg.max_steps, desc="sft", disable=not cfg.progress, leave=False, mininterval=1.0)
        while step < cfg.max_steps:
            if pos + cfg.batch_size > len(perm):
                perm, pos = torch.randperm(len(train), generator=gen), 0
            batch = [train[i] for i in perm[pos : pos + cfg.batch_size].tolist()]
            pos += cfg.batch_size
            loss = completion_loss(model, *make_batch(tokenizer, batch))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip, foreach=foreach)
            opt.step()
            sched.step()
            step += 1
            losses.append(loss.item())
            if not math.isfinite(losses[-1]):
                stop_reason = "non_finite_loss"
                break
            bar.update(1)
            if holdout and step % cfg.eval_every == 0:
                acc = accuracy(model, tokenizer, holdout)
                history.append({"step": step, "acc": acc, "loss": losses[-1]})
                bar.set_postfix(loss=f"{losses[-1]:.3f}", acc=f"{acc:.2f}")
                streak = streak + 1 if acc >= lo else 0
                if streak >= cfg.evals_in_band:
                    stop_reason = "reached_band" if acc <= hi else "above_band"
                    break
            if cfg.max_time_s is not None and time.perf_counter() - t0 > cfg.max_time_s:
                stop_reason = "max_time"
                break
        bar.close()
        model.eval()
        if holdout and history[-1]["step"] != step:
            acc = accuracy(model, tokenizer, holdout)
            history.append({"step": step, "acc": acc, "loss": losses[-1] if losses else None})

    return {
        "acc_before": acc0,
        "acc_after": acc,
        "acc_band": [lo, hi],
        "in_band": bool(lo <= acc <= hi),
        "stop_reason": stop_reason,
        "steps": step,
        "n_train": len(train),
        "n_holdout": len(holdout),
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "losses": losses,
        "history": history,
        "wall_s": time.perf_counter() - t0,
        "device": str(_device_of(model)),
        "experts_implementation": getattr(model.config, "_experts_implementation", None),
        "config": asdict(cfg),
    }
