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


def prepare_local(sec: dict[str, Any], out: Path) -> dict[str, Any]:
    model = Path(sec["model_path"])
    if not (model / "config.json").is_file():
        raise FileNotFoundError(f"prepare.model_path {model}: no config.json (an HF checkpoint folder?)")
    (out / "data").mkdir(parents=True, exist_ok=True)
    _link(model, out / "base_model")
    from minite.rl.task import load_jsonl

    counts = {}
    for split in ("train", "eval"):
        src = Path(sec["data"][split])
        counts[split] = len(load_jsonl(src))  # validates every line, naming file and line
        _link(src, out / "data" / f"{split}.jsonl")
    return {"kind": "local", "model_path": str(model), "n_train": counts["train"], "n_eval": counts["eval"]}


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
    save_model(model, tok, out / "base_model")
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
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        kind = sec.get("kind", "tiny")
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
        else:
            raise ConfigError(f"prepare.kind {kind!r}: use 'tiny' or 'local'")
        metrics = dict(metrics or {})
        metrics.setdefault("wall_s", time.perf_counter() - t0)
        (out / "prepare_metrics.json").write_text(json.dumps(metrics, indent=2, default=str) + "\n")
        print(f"minite prepare: {kind} -> {out} ({metrics.get('wall_s', 0):.0f} s)")
        return 0

    return run_guarded(go)
