"""`minite prepare`: task data, tokenizer and base model of a profile (its `prepare:` section).

Writes into --out: data/train.jsonl, data/eval.jsonl, base_model/ (HF layout), prepare_metrics.json.

    minite prepare --profile configs/tiny.yaml --out results/tiny/prepare [--set prepare.sft.max_steps=50]

Kinds (minite.rl.prepare_inputs):
- `tiny`: the arithmetic task's splits, the character tokenizer and an SFT-warmed tiny Qwen3-MoE.
- `qwen3` (paper-mini): Qwen3-30B-A3B's architecture with `prepare.model` overrides, random init,
  Qwen3's tokenizer; data from `prepare.data` files or `prepare.word_problems` (written in the paper's
  formats, plus local eval files under eval/).
- `local` (paper): an existing checkpoint folder (`model_path`, linked) and `prepare.data` files (verl
  parquet, or JSONL in the MATH-500 / AIME / prompt-answer schemas), normalized into data/.
Paths are checked here, when the job runs, not when the workflow is planned; everything is checked
before --out is touched (rl.prompt of the profile says whether the tokenizer needs a chat template).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from minite.commands.common import add_set_arg, parse_set, run_guarded
from minite.configuration import ConfigError, deep_merge, from_dict


def _profile(path: str, overrides: dict[str, Any]) -> dict[str, Any]:
    from minite.profiles import load_layers

    cfg: dict[str, Any] = {}
    for _, data in load_layers(path):
        cfg = deep_merge(cfg, data)
    return deep_merge(cfg, overrides)


def check_tiny(sec: dict[str, Any]) -> None:
    """Validate a `kind: tiny` section before anything is written: task and SFT fields (unknown keys
    get a did-you-mean), the SFT device (cuda where torch sees none), model overrides (known Qwen3-MoE
    config keys, NVFP4-blockable dims)."""
    from minite.engines.device import resolve_device
    from minite.models.tiny import build_tiny_config, check_nvfp4_dims
    from minite.rl.sft import SFTConfig
    from minite.rl.task import TaskConfig

    from_dict(TaskConfig, sec.get("task") or {}, where="prepare.task")
    sft_cfg = from_dict(SFTConfig, sec.get("sft") or {}, where="prepare.sft")
    resolve_device(sft_cfg.device, "prepare.sft.device")
    model = sec.get("model") or {}
    if not isinstance(model, dict):
        raise ConfigError(f"prepare.model: expected a mapping of model config overrides, got {model!r}")
    base = build_tiny_config()
    valid = sorted({*base.to_dict(), *base.attribute_map})  # attribute_map: aliases (num_experts)
    for key in model:
        if key not in valid:
            import difflib

            close = difflib.get_close_matches(key, valid, n=1)
            did = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"prepare.model: unknown key {key!r}{did}; use a field of transformers' Qwen3MoeConfig"
            )
    try:
        check_nvfp4_dims(build_tiny_config(**model))
    except ValueError as e:
        raise ConfigError(f"prepare.model: {e}; every quantized linear needs multiples of 16") from e


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="minite prepare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--profile", required=True, help="workflow profile YAML (its `prepare:` section)")
    p.add_argument("--out", required=True)
    add_set_arg(p)
    args = p.parse_args(argv)

    def go() -> int:
        cfg = _profile(args.profile, parse_set(args.set))
        sec = cfg.get("prepare")
        if not isinstance(sec, dict):
            raise ConfigError(f"{args.profile}: no `prepare:` section")
        kind = sec.get("kind", "tiny")
        from minite.rl import prepare_inputs as P

        # everything is checked before --out is created: a bad input writes nothing
        if kind == "local":
            P.check_local(sec, cfg)
        elif kind == "qwen3":
            P.check_qwen3(sec)
        elif kind == "tiny":
            check_tiny(sec)
        else:
            raise ConfigError(f"prepare.kind {kind!r}: use 'tiny' or 'local' (or 'qwen3')")
        out = Path(args.out)
        t0 = time.perf_counter()
        if kind == "local":
            metrics = P.prepare_local(out, sec, cfg)
        elif kind == "qwen3":
            metrics = P.prepare_qwen3(out, sec, cfg)
        else:
            from minite.rl.sft import SFTConfig
            from minite.rl.task import TaskConfig

            metrics = P.prepare_tiny(
                out,
                from_dict(TaskConfig, sec.get("task") or {}, where="prepare.task"),
                sec.get("model") or {},
                from_dict(SFTConfig, sec.get("sft") or {}, where="prepare.sft"),
            )
        metrics = dict(metrics or {})
        metrics.setdefault("wall_s", time.perf_counter() - t0)
        (out / "prepare_metrics.json").write_text(json.dumps(metrics, indent=2, default=str) + "\n")
        print(f"minite prepare: {kind} -> {out} ({metrics.get('wall_s', 0):.0f} s)")
        return 0

    return run_guarded(go)
