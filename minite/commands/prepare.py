"""`minite prepare`: task data, tokenizer and base model of a profile (its `prepare:` section).

PLACEHOLDER written by the workflow worker until the RL-core worker's verb lands: it calls
`minite.rl.prepare.prepare_tiny` when that exists and otherwise does the same steps inline (task
splits, char tokenizer, tiny Qwen3-MoE, SFT warm start). Writes into --out:
    data/train.jsonl, data/eval.jsonl, base_model/ (HF layout), prepare_metrics.json

    minite prepare --profile configs/tiny.yaml --out results/tiny/prepare [--set prepare.sft.max_steps=50]

`prepare.kind: local` (paper profile) links an existing checkpoint (`model_path`) and data files
(`data.train`, `data.eval`, JSONL of {"prompt", "answer"}) into the same layout; paths are checked
here, when the job runs, not when the workflow is planned.
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


def _link(src: Path, dst: Path) -> None:
    if dst.is_symlink() or dst.exists():
        dst.unlink()
    dst.symlink_to(src.resolve())


def check_local(sec: dict[str, Any]) -> dict[str, int]:
    """Validate a `kind: local` section before anything is written: the checkpoint folder and both
    data files exist and every data line parses. Returns {split: number of examples}."""
    model = sec.get("model_path")
    data = sec.get("data")
    if not isinstance(model, str) or not isinstance(data, dict) or not {"train", "eval"} <= set(data):
        raise ConfigError(
            "prepare (kind local): needs model_path (an HF checkpoint folder) and data: {train: FILE, "
            "eval: FILE} (JSONL of {prompt, answer}); add the missing keys to the profile's prepare section"
        )
    if not (Path(model) / "config.json").is_file():
        raise FileNotFoundError(f"prepare.model_path {model}: no config.json (an HF checkpoint folder?)")
    from minite.rl.task import load_jsonl

    counts = {}
    for split in ("train", "eval"):
        src = Path(data[split])
        if not src.is_file():
            raise FileNotFoundError(f"prepare.data.{split}: no file {src}")
        counts[split] = len(load_jsonl(src))  # validates every line, naming file and line
    return counts


def prepare_local(sec: dict[str, Any], out: Path) -> dict[str, Any]:
    counts = check_local(sec)
    model = Path(sec["model_path"])
    (out / "data").mkdir(parents=True, exist_ok=True)
    _link(model, out / "base_model")
    for split in ("train", "eval"):
        _link(Path(sec["data"][split]), out / "data" / f"{split}.jsonl")
    return {"kind": "local", "model_path": str(model), "n_train": counts["train"], "n_eval": counts["eval"]}


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


def prepare_tiny_inline(sec: dict[str, Any], out: Path) -> dict[str, Any]:
    from minite.models.tiny import build_tiny_config, build_tiny_model, save_model
    from minite.models.tokenizer import build_tokenizer
    from minite.rl.sft import SFTConfig, sft
    from minite.rl.task import TaskConfig, generate, save_jsonl

    task = from_dict(TaskConfig, sec.get("task") or {}, where="prepare.task")
    sft_cfg = from_dict(SFTConfig, sec.get("sft") or {}, where="prepare.sft")
    train, ev = generate(task)
    (out / "data").mkdir(parents=True, exist_ok=True)
    save_jsonl(train, out / "data" / "train.jsonl")
    save_jsonl(ev, out / "data" / "eval.jsonl")
    tok = build_tokenizer()
    model = build_tiny_model(build_tiny_config(**(sec.get("model") or {})), seed=task.seed)
    stats = sft(model, tok, train, sft_cfg)
    save_model(model.cpu(), tok, out / "base_model")
    stats.pop("losses", None)
    return {"kind": "tiny", "n_train": len(train), "n_eval": len(ev), "sft": stats}


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
        # everything is checked before --out is created: a bad input writes nothing
        if kind == "local":
            check_local(sec)
        elif kind == "tiny":
            check_tiny(sec)
        else:
            raise ConfigError(f"prepare.kind {kind!r}: use 'tiny' or 'local'")
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        if kind == "local":
            metrics = prepare_local(sec, out)
        elif kind == "tiny":
            try:
                from minite.rl.prepare import prepare_tiny
            except ImportError:
                metrics = prepare_tiny_inline(sec, out)
            else:
                from minite.rl.sft import SFTConfig
                from minite.rl.task import TaskConfig

                metrics = prepare_tiny(
                    out,
                    from_dict(TaskConfig, sec.get("task") or {}, where="prepare.task"),
                    sec.get("model") or {},
                    from_dict(SFTConfig, sec.get("sft") or {}, where="prepare.sft"),
                )
                if (out / "prepare_metrics.json").is_file():
                    metrics = json.loads((out / "prepare_metrics.json").read_text())
        metrics = dict(metrics or {})
        metrics.setdefault("wall_s", time.perf_counter() - t0)
        (out / "prepare_metrics.json").write_text(json.dumps(metrics, indent=2, default=str) + "\n")
        print(f"minite prepare: {kind} -> {out} ({metrics.get('wall_s', 0):.0f} s)")
        return 0

    return run_guarded(go)
