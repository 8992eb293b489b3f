"""Prepare stage: task data + base model, written atomically. The tiny reproduction's (task splits +
an SFT-warm-started tiny model, `prepare_tiny`), and the paper's setting's (a Qwen3 model built from
Qwen3-30B-A3B's config, or a local checkpoint, with math data; `prepare_qwen3`, `prepare_local`).

Why one stage: the data and the base model are the common input of every RL run (BF16, TE-style
NVFP4, miniTE-aligned), so they are produced once, deterministically from the configs, and never
half-written: everything goes to a temporary sibling directory that is renamed into place only when
complete, so an interrupted run cannot leave a directory that a later workflow step mistakes for a
finished one.

Output layout:
    out_dir/data/train.jsonl, out_dir/data/eval.jsonl   one example per line ({"prompt", "answer"}
                                                        for tiny; minite.rl.data's rows otherwise)
    out_dir/base_model/                                 HF layout (safetensors, config, tokenizer)
    out_dir/prepare_metrics.json                        sizes, timings, configs (tiny: SFT accuracy)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import transformers

from minite.checkpoint import sha256_file
from minite.configuration import ConfigError
from minite.engines.device import resolve_device
from minite.models.tiny import build_tiny_config, build_tiny_model, save_model
from minite.models.tokenizer import build_tokenizer
from minite.rl.completion_formats import make_splits
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


@contextlib.contextmanager
def _staged(out: Path) -> Iterator[Path]:
    """A fresh temporary sibling of `out` to write into: moved into place when the block ends, deleted
    when it raises (an interrupted prepare never leaves a half-written `out`)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        yield tmp
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_metrics(tmp: Path, metrics: dict[str, Any]) -> None:
    (tmp / "prepare_metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")


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
    t0 = time.perf_counter()
    with _staged(Path(out_dir)) as tmp:
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
        _write_metrics(tmp, metrics)
    return metrics


# --- the paper's setting: a Qwen3 model (built, or a local checkpoint) and math data -----------------------
#
# kind qwen3: Qwen3-30B-A3B's architecture with `prepare.model` overrides, random init, Qwen3's tokenizer
# (minite.models.qwen3); kind local: an existing checkpoint folder (`model_path`, linked as base_model).
# Both take their data the same way: `prepare.data: {train, eval}` files in any format minite.rl.data
# reads, or `prepare.word_problems` (minite.rl.word_problems), which are written in the paper's formats
# (a verl parquet for RL, MATH-500 / AIME files for lm-eval under eval/) and read back through the same
# readers. data/train.jsonl and data/eval.jsonl are the normalized rows the RL loop reads.
#
# Output layout (besides data/ and base_model/): raw/ (the word problems' verl parquet and eval split),
# eval/math500.jsonl, eval/aime24.jsonl, eval/aime25.jsonl (word problems with n_eval_files > 0).

EVAL_FILES = {"math500": "math500.jsonl", "aime24": "aime24.jsonl", "aime25": "aime25.jsonl"}


def data_plan(sec: dict[str, Any]) -> str:
    """ "files" or "word_problems": where a qwen3/local prepare section takes its data from."""
    has_files, has_words = sec.get("data") is not None, sec.get("word_problems") is not None
    if has_files == has_words:
        raise ConfigError(
            f"prepare (kind {sec.get('kind')}): give exactly one of data: {{train: FILE, eval: FILE}} (JSONL "
            "or verl parquet) or word_problems: {seed, n_train, n_eval, n_eval_files}; add the missing keys"
        )
    if has_files:
        data = sec["data"]
        if not isinstance(data, dict) or not {"train", "eval"} <= set(data):
            raise ConfigError(
                "prepare.data: needs data: {train: FILE, eval: FILE} (JSONL or verl parquet); add the "
                "missing keys"
            )
        return "files"
    return "word_problems"


def check_data(sec: dict[str, Any]) -> dict[str, int]:
    """Read every row of the data files (errors name file:row) or validate word_problems; {split: n}."""
    from minite.configuration import from_dict
    from minite.rl.data import read_examples
    from minite.rl.word_problems import WordProblemsConfig

    if data_plan(sec) == "word_problems":
        wp = from_dict(WordProblemsConfig, sec["word_problems"], where="prepare.word_problems")
        return {"train": wp.n_train, "eval": wp.n_eval}
    counts = {}
    for split in ("train", "eval"):
        src = Path(sec["data"][split])
        if not src.is_file():
            raise FileNotFoundError(f"prepare.data.{split}: no file {src}")
        counts[split] = len(read_examples(src))
    return counts


def _write_data(sec: dict[str, Any], tmp: Path, instruction: str) -> dict[str, Any]:
    from minite.configuration import from_dict
    from minite.rl import data as D
    from minite.rl.word_problems import WordProblemsConfig, generate

    (tmp / "data").mkdir(parents=True, exist_ok=True)
    if data_plan(sec) == "files":
        sources = {s: Path(sec["data"][s]) for s in ("train", "eval")}
        info: dict[str, Any] = {"data": {s: str(p) for s, p in sources.items()}}
    else:
        wp = from_dict(WordProblemsConfig, sec["word_problems"], where="prepare.word_problems")
        train, ev, files = generate(wp)
        (tmp / "raw").mkdir()
        sources = {"train": tmp / "raw" / "train.parquet", "eval": tmp / "raw" / "eval_math500.jsonl"}
        D.write_verl_parquet(sources["train"], train, instruction)  # DAPO-Math-17k's layout
        D.write_math500_jsonl(sources["eval"], ev)
        if files:
            (tmp / "eval").mkdir()
            D.write_math500_jsonl(tmp / "eval" / EVAL_FILES["math500"], files)
            D.write_aime24_jsonl(tmp / "eval" / EVAL_FILES["aime24"], files)
            D.write_aime25_jsonl(tmp / "eval" / EVAL_FILES["aime25"], files)
        info = {"word_problems": asdict(wp), "eval_files": sorted(EVAL_FILES.values()) if files else []}
    counts = {}
    for split, src in sources.items():
        rows = D.read_examples(src)  # the same readers as for a user's files
        D.write_examples(tmp / "data" / f"{split}.jsonl", rows)
        counts[f"n_{split}"] = len(rows)
        info.setdefault("data_sources", {})[split] = sorted({r.data_source for r in rows})
    return {**info, **counts}


def _chat(cfg: dict[str, Any]) -> tuple[bool, str]:
    """(prompt format is chat, instruction) of a profile's rl.prompt."""
    from minite.configuration import from_dict
    from minite.rl.prompts import PromptConfig

    prompt = from_dict(PromptConfig, (cfg.get("rl") or {}).get("prompt") or {}, where="rl.prompt")
    return prompt.format == "chat", prompt.instruction


def check_qwen3(sec: dict[str, Any]) -> None:
    """kind qwen3 before anything is written: model overrides (known keys, NVFP4-blockable dims), the
    tokenizer source, the data."""
    import difflib

    from minite.models.qwen3 import config_keys, packaged_tokenizer_dir, qwen3_config

    if sec.get("model_path") is not None:
        raise ConfigError(
            "prepare.model_path is the checkpoint of kind local; kind qwen3 builds its model from "
            "prepare.model overrides: set model_path to null or kind to local"
        )
    model = sec.get("model") or {}
    if not isinstance(model, dict):
        raise ConfigError(f"prepare.model: expected a mapping of Qwen3MoeConfig overrides, got {model!r}")
    valid = config_keys()
    for key in model:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            did = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"prepare.model: unknown key {key!r}{did}; use a field of Qwen3MoeConfig")
    try:
        qwen3_config(**model)
    except ValueError as e:
        raise ConfigError(f"prepare.model: {e}; every quantized linear needs multiples of 16") from e
    tok = sec.get("tokenizer")
    if tok is None:
        packaged_tokenizer_dir()
    elif not (Path(tok) / "tokenizer.json").is_file():
        raise FileNotFoundError(f"prepare.tokenizer {tok}: no tokenizer.json (an HF tokenizer folder?)")
    check_data(sec)


def prepare_qwen3(out_dir: str | Path, sec: dict[str, Any], profile: dict[str, Any]) -> dict[str, Any]:
    """Build the Qwen3 model of `sec` (random init, `sec.seed`), its tokenizer and data; atomically."""
    from minite.models.qwen3 import build_qwen3_model, check_model_dir, qwen3_config, save_qwen3

    chat, instruction = _chat(profile)
    check_qwen3(sec)
    t0 = time.perf_counter()
    with _staged(Path(out_dir)) as tmp:
        cfg = qwen3_config(**(sec.get("model") or {}))
        model = build_qwen3_model(cfg, seed=int(sec.get("seed", 0)))
        save_qwen3(model, tmp / "base_model", sec.get("tokenizer"))
        found = check_model_dir(tmp / "base_model", chat=chat)
        metrics = {
            "kind": "qwen3",
            **_write_data(sec, tmp, instruction),
            "n_params": sum(p.numel() for p in model.parameters()),
            "model_overrides": dict(sec.get("model") or {}),
            "model_config": cfg.to_dict(),
            "tokenizer_size": found["tokenizer_size"],
            "model_sha256": sha256_file(tmp / "base_model" / "model.safetensors"),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        }
        metrics["wall_s"] = time.perf_counter() - t0
        _write_metrics(tmp, metrics)
    return metrics


def check_local(sec: dict[str, Any], profile: dict[str, Any]) -> dict[str, int]:
    """kind local before anything is written: the checkpoint folder (config, weights, a tokenizer that
    fits its vocab, a chat template when rl.prompt.format is chat) and every data row."""
    from minite.models.qwen3 import check_model_dir

    model = sec.get("model_path")
    if not isinstance(model, str):
        raise ConfigError(
            "prepare (kind local): needs model_path (an HF checkpoint folder) and data: {train: FILE, "
            "eval: FILE} (JSONL or verl parquet); add the missing keys to the profile's prepare section"
        )
    if not (Path(model) / "config.json").is_file():
        raise FileNotFoundError(f"prepare.model_path {model}: no config.json (an HF checkpoint folder?)")
    counts = check_data(sec)
    check_model_dir(model, chat=_chat(profile)[0])
    return counts


def prepare_local(out_dir: str | Path, sec: dict[str, Any], profile: dict[str, Any]) -> dict[str, Any]:
    """Link the checkpoint folder as base_model (never copied: it may be 60 GB) and write the data."""
    check_local(sec, profile)
    t0 = time.perf_counter()
    with _staged(Path(out_dir)) as tmp:
        tmp.mkdir(parents=True)
        (tmp / "base_model").symlink_to(Path(sec["model_path"]).resolve())
        metrics = {
            "kind": "local",
            "model_path": str(sec["model_path"]),
            **_write_data(sec, tmp, _chat(profile)[1]),
        }
        metrics["wall_s"] = time.perf_counter() - t0
        _write_metrics(tmp, metrics)
    return metrics
