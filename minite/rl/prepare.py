"""Prepare stage of the tiny reproduction: task data + SFT-warm-started base model, written atomically.

Why one function: the data and the base model are the common input of every RL run (BF16, TE-style
NVFP4, miniTE-aligned), so they are produced once, deterministically from the configs, and never
half-written: everything goes to a temporary sibling directory that is renamed into place only when
complete, so an interrupted run cannot leave a directory that a later workflow step mistakes for a
finished one.

Output layout:
    out_dir/data/train.jsonl, out_dir/data/eval.jsonl   {"prompt", "answer"} per line
    out_dir/base_model/                                 HF layout (safetensors, config, tokenizer)
    out_dir/prepare_metrics.json                        accuracy before/after SFT, timings, configs
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import transformers

from minite.checkpoint import sha256_file
from minite.engines.device import resolve_device
from minite.models.tiny import build_tiny_config, build_tiny_model, save_model
from minite.models.tokenizer import build_tokenizer
from minite.rl.formats import make_splits
from minite.rl.sft import SFTConfig, accuracy, place_model, sft
from minite.rl.task import TaskConfig, save_jsonl


def _replace_dir(tmp: Path, out: Path) -> None:
    """Move the finished `tmp` to `out`; an existing `out` is swapped out first, then deleted."""
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    if old.exists():
        shutil.rmtree(old)


def prepare_tiny(
    out_dir: str | Path,
    task_cfg: TaskConfig | None = None,
    model_overrides: dict[str, Any] | None = None,
    sft_cfg: SFTConfig | None = None,
) -> dict[str, Any]:
    """Generate the task splits, build + SFT the tiny model, write everything under `out_dir`.

    The model is initialised with `sft_cfg.seed` (on the CPU, so the starting weights do not depend on
    the device); SFT and the eval-split accuracy (greedy exact match, before and after SFT) run on
    `sft_cfg.device`; the model is saved from the CPU. Returns the metrics also written to
    prepare_metrics.json.
    """
    task_cfg = task_cfg or TaskConfig()
    sft_cfg = sft_cfg or SFTConfig()
    device = resolve_device(sft_cfg.device, "prepare.sft.device")  # before anything is written
    model_overrides = dict(model_overrides or {})
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    t0 = time.perf_counter()
    try:
        train, ev = make_splits(task_cfg)  # in task_cfg.format
        (tmp / "data").mkdir(parents=True)
        save_jsonl(train, tmp / "data" / "train.jsonl")
        save_jsonl(ev, tmp / "data" / "eval.jsonl")

        tokenizer = build_tokenizer()
        model_cfg = build_tiny_config(**model_overrides)
        model = build_tiny_model(model_cfg, seed=sft_cfg.seed)
        if device.type != "cpu":
            place_model(model, device)
        threads = torch.get_num_threads()
        torch.set_num_threads(sft_cfg.num_threads)
        try:
            eval_before = accuracy(model, tokenizer, ev)
            sft_metrics = sft(model, tokenizer, train, sft_cfg)
            eval_after = accuracy(model, tokenizer, ev)
        finally:
            torch.set_num_threads(threads)
        if device.type != "cpu":
            place_model(model, torch.device("cpu"))  # the checkpoint as a CPU run writes it
        save_model(model, tokenizer, tmp / "base_model")

        metrics = {
            "eval_acc_before": eval_before,
            "eval_acc_after": eval_after,
            "holdout_acc_before": sft_metrics["acc_before"],
            "holdout_acc_after": sft_metrics["acc_after"],
            "in_band": sft_metrics["in_band"],
            "sft_steps": sft_metrics["steps"],
            "sft_stop_reason": sft_metrics["stop_reason"],
            "sft_wall_s": sft_metrics["wall_s"],
            "wall_s": time.perf_counter() - t0,
            "n_train": len(train),
            "n_eval": len(ev),
            "n_params": sum(p.numel() for p in model.parameters()),
            "device": str(device),
            "model_sha256": sha256_file(tmp / "base_model" / "model.safetensors"),
            "task_config": asdict(task_cfg),
            "model_overrides": model_overrides,
            "model_config": model_cfg.to_dict(),
            "sft": sft_metrics,
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        }
        (tmp / "prepare_metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return metrics
