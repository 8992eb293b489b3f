"""Bad input fails in seconds, before any compute, and says what to fix.

Every row of CASES feeds one mistake a user can make to the entry point that user hits: a `minite` CLI
verb run in-process through `minite.cli.main` (exit code 2, one line on stderr, no traceback), or the
loader the Snakefile / a library user calls (`minite.profiles.load_profile`, `minite.recipes.get_recipe`),
which raises ConfigError. Each row asserts
  (a) it fails before any compute: nothing under the test's folder is created or changed (no output
      dir, no checkpoint, no metrics; a pre-existing run folder stays byte-identical), and
  (b) the message names the offending key / file / value and says the fix (substrings below).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml

from minite.cli import main as cli
from minite.configuration import ConfigError, deep_merge


@contextmanager
def one_rank(**env: str) -> Iterator[None]:
    """The environment torchrun gives the rank of a 1-process job (plus `env`): `minite train-dist`
    then runs that rank in this process (gloo), so its errors reach this test's stderr."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    rank = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    with mock.patch.dict(os.environ, {**rank, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **env}):
        yield


class Inputs:
    """A scratch folder with valid inputs; each case breaks one thing. `out` must never appear."""

    def __init__(self, root: Path, tiny: dict[str, Path]) -> None:
        self.root = root
        self.model_dir = tiny["model_dir"]
        self.data_dir = tiny["data_dir"]
        self.out = root / "out"

    def write(self, name: str, content: str | bytes) -> Path:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return path

    def yaml(self, name: str, mapping: Any) -> Path:
        return self.write(name, yaml.safe_dump(mapping))

    def run_config(self, **overrides: Any) -> dict[str, Any]:
        base = {
            "model_dir": str(self.model_dir),
            "data_dir": str(self.data_dir),
            "out_dir": str(self.out),
            "recipe": "minite",
            "steps": 2,
            "checkpoint_every": 1,
            "rollout": {"prompts_per_step": 4, "max_new_tokens": 4},
            "grpo": {"group_size": 4},
            "eval": {"every": 0, "n_examples": 4},
        }
        return deep_merge(base, overrides)

    def train(self, *extra: str, **overrides: Any) -> int:
        """`minite train --config run.yaml` with `overrides` merged into a valid run config."""
        path = self.yaml("run.yaml", self.run_config(**overrides))
        return cli(["train", "--config", str(path), "--no-progress", *extra])

    def train_dist(self, *extra: str, env: dict[str, str] | None = None, **overrides: Any) -> int:
        """`minite train-dist` as rank 0 of 1 (in this process), else like `train`."""
        path = self.yaml("run.yaml", self.run_config(**overrides))
        with one_rank(**(env or {})):
            return cli(["train-dist", "--config", str(path), "--no-progress", *extra])

    def model_copy(self, weights: bool = True, config_text: str | None = None, **config: Any) -> Path:
        """The tiny model folder (files linked) with config.json fields replaced (or its whole text)."""
        dst = self.root / "model"
        dst.mkdir()
        for f in self.model_dir.iterdir():
            if f.name == "config.json" or (f.suffix == ".safetensors" and not weights):
                continue
            (dst / f.name).symlink_to(f)
        cfg = json.loads((self.model_dir / "config.json").read_text())
        (dst / "config.json").write_text(
            json.dumps({**cfg, **config}) if config_text is None else config_text
        )
        return dst

    def data_copy(self, train: str | bytes | None = None, eval_: bool = True) -> Path:
        dst = self.root / "data"
        dst.mkdir()
        src_train = (self.data_dir / "train.jsonl").read_text()
        self.write("data/train.jsonl", src_train if train is None else train)
        if eval_:
            shutil.copy(self.data_dir / "eval.jsonl", dst / "eval.jsonl")
        return dst

    def checkpoint(self, recipe: str = "minite", corrupt: bool = False) -> None:
        """A real checkpoint (safetensors + manifest) in out/checkpoint, as `minite train` leaves it."""
        import torch

        from minite.checkpoint import save_checkpoint

        save_checkpoint(self.out / "checkpoint", torch.nn.Linear(16, 16), None, {"step": 1, "recipe": recipe})
        if corrupt:  # one flipped byte in the last tensor's data, e.g. bit rot or a bad copy
            _flip_byte(self.out / "checkpoint" / "model.safetensors")

    def sharded_checkpoint(self, recipe: str = "minite", corrupt: bool = False) -> None:
        """A real sharded checkpoint (DCP shards + state.json + manifest) in out/checkpoint_sharded, as
        `minite train-dist` leaves it (written by one gloo rank)."""
        import torch
        import torch.distributed as dist

        from minite.distributed.sharded_checkpoint import save_sharded_checkpoint

        model = torch.nn.Linear(16, 16)
        with one_rank():
            dist.init_process_group("gloo")
            try:
                state = {"step": 1, "recipe": recipe}
                save_sharded_checkpoint(
                    self.out / "checkpoint_sharded", model, torch.optim.AdamW(model.parameters()), state
                )
            finally:
                dist.destroy_process_group()
        if corrupt:
            (shard,) = (self.out / "checkpoint_sharded").glob("shard-*.safetensors")
            _flip_byte(shard)


def _flip_byte(f: Path) -> None:
    blob = bytearray(f.read_bytes())
    blob[-3] ^= 0xFF
    f.write_bytes(bytes(blob))


def _lines(n: int) -> str:
    return "".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(n))


def _recipe(inp: Inputs, mapping: dict[str, Any]):
    from minite.recipes import get_recipe

    return get_recipe(str(inp.yaml("recipe.yaml", mapping)))


def _profile(name: str, overrides: dict[str, Any] | None = None):
    from minite.profiles import load_profile

    return load_profile(name, overrides)


def _ablation(inp: Inputs, body: str):
    folder = inp.root / "ablations"
    folder.mkdir()
    (folder / "my_ablation.yaml").write_text(body)
    return _profile("tiny", {"paths": {"ablations": str(folder)}, "ablations": ["my_ablation"]})


def _prepare(inp: Inputs, section: dict[str, Any]) -> int:
    path = inp.yaml("profile.yaml", {"prepare": section})
    return cli(["prepare", "--profile", str(path), "--out", str(inp.out)])


def _train_with_profile(inp: Inputs, rl: dict[str, Any]) -> int:
    path = inp.yaml("profile.yaml", {"rl": rl})
    args = ["--model-dir", str(inp.model_dir), "--data-dir", str(inp.data_dir), "--out", str(inp.out)]
    return cli(["train", "--profile", str(path), "--recipe", "minite", "--no-progress", *args])


@dataclass(frozen=True)
class Case:
    id: str
    run: Callable[[Inputs], Any]  # calls the entry point; returns a CLI exit code or raises
    expect: tuple[str, ...]  # substrings of the message: the key/file/value, and the fix
    error: type[BaseException] | None = None  # None: a CLI verb, exit code 2 and the message on stderr
    setup: Callable[[Inputs], None] | None = None  # makes an existing run folder (`out/`) first


CASES: list[Case] = [
    # --- the train config (`minite train --config run.yaml`) ----------------------------------------
    Case(
        "train-unknown-key",
        lambda i: i.train(stpes=4),
        ("run.yaml", "unknown key 'stpes'", "did you mean 'steps'"),
    ),
    Case(
        "train-unknown-nested-key",
        lambda i: i.train(rollout={"prompts_per_stp": 4}),
        ("run.yaml.rollout", "unknown key 'prompts_per_stp'", "did you mean 'prompts_per_step'"),
    ),
    Case(
        "train-wrong-type", lambda i: i.train(steps="ten"), ("run.yaml.steps", "expected an integer", "'ten'")
    ),
    Case(
        "train-wrong-type-bool",
        lambda i: i.train(grpo={"tis": "yes"}),
        ("run.yaml.grpo.tis", "expected true/false", "'yes'"),
    ),
    Case(
        "train-bad-literal",
        lambda i: i.train(on_nonfinite="skp"),
        ("on_nonfinite", "'skp' is not one of ['stop', 'skip']", "did you mean 'skip'"),
    ),
    Case(
        "train-config-not-yaml",
        lambda i: cli(["train", "--config", str(i.write("run.yaml", "steps: [1, 2\n"))]),
        ("run.yaml", "not valid YAML"),
    ),
    Case(
        "train-config-not-a-mapping",
        lambda i: cli(["train", "--config", str(i.write("run.yaml", "- steps\n"))]),
        ("run.yaml", "top level must be a mapping"),
    ),
    Case(
        "train-config-missing",
        lambda i: cli(["train", "--config", str(i.root / "nope.yaml")]),
        ("config file not found", "nope.yaml"),
    ),
    Case(
        "train-no-config-source",
        lambda i: cli(["train"]),
        ("give --config RUN.yaml or --profile PROFILE.yaml",),
    ),
    Case(
        "train-bad-set-override",
        lambda i: i.train("--set", "steps"),
        ("--set expects key=value", "'steps'"),
    ),
    Case(
        "train-steps-not-an-int",
        lambda i: i.train("--steps", "abc"),
        ("argument --steps", "invalid int value: 'abc'"),
    ),
    Case(
        "train-profile-unknown-rl-key",
        lambda i: _train_with_profile(i, {"stpes": 3}),
        ("profile.yaml: rl", "unknown key 'stpes'", "did you mean 'steps'"),
    ),
    Case(
        "train-recipe-typo",
        lambda i: i.train("--recipe", "minitee"),
        ("unknown recipe 'minitee'", "did you mean 'minite'", "give a YAML path"),
    ),
    # --- values out of range --------------------------------------------------------------------
    Case(
        "train-zero-steps", lambda i: i.train("--steps", "0"), ("steps must be >= 1, got 0", "set steps to 1")
    ),
    Case(
        "train-negative-micro-batch",
        lambda i: i.train(micro_batch=-4),
        ("micro_batch must be >= 1, got -4", "set micro_batch to 1 or more"),
    ),
    Case(
        "train-zero-prompts-per-step",
        lambda i: i.train(rollout={"prompts_per_step": 0}),
        ("run.yaml.rollout", "prompts_per_step must be >= 1, got 0"),
    ),
    Case(
        "train-zero-checkpoint-every",
        lambda i: i.train(checkpoint_every=0),
        ("checkpoint_every must be >= 1, got 0",),
    ),
    Case(
        "train-negative-eval-every",
        lambda i: i.train(eval={"every": -1}),
        ("run.yaml.eval", "every must be >= 0, got -1"),
    ),
    Case(
        "train-minibatches-exceed-batch",
        lambda i: i.train(minibatches=64),
        ("minibatches=64 exceeds the 16 sequences", "grpo.group_size=4", "set minibatches <= 16"),
    ),
    Case(
        "train-grpo-group-size-1",
        lambda i: i.train(grpo={"group_size": 1}),
        ("run.yaml.grpo", "group_size must be an int >= 2, got 1"),
    ),
    Case(
        "train-nan-lr",
        lambda i: i.train(optim={"lr": float("nan")}),
        ("run.yaml.optim", "lr must be a finite number > 0, got nan"),
    ),
    Case(
        "train-inf-lr",
        lambda i: i.train(optim={"lr": float("inf")}),
        ("run.yaml.optim", "lr must be a finite number > 0, got inf"),
    ),
    Case(
        "train-nan-temperature",
        lambda i: i.train(rollout={"temperature": float("nan")}),
        ("run.yaml.rollout", "rollout.temperature must be a finite number > 0", "got nan"),
    ),
    Case(
        "train-too-few-examples",
        lambda i: i.train(data_dir=str(i.data_copy(train=_lines(2)))),
        ("prompts_per_step=4 exceeds the 2 examples", "train.jsonl", "lower it or add examples"),
    ),
    # --- files ----------------------------------------------------------------------------------
    Case(
        "train-missing-model-dir",
        lambda i: i.train("--model-dir", str(i.root / "no_model")),
        ("no_model", "no config.json", "run `minite prepare` first"),
    ),
    Case(
        "train-model-dir-without-weights",
        lambda i: i.train(model_dir=str(i.model_copy(weights=False))),
        (
            "model",
            "no *.safetensors weights",
        ),
    ),
    Case(
        "train-model-config-corrupt",
        lambda i: i.train(model_dir=str(i.model_copy(config_text='{"hidden_size": 128,'))),
        ("model/config.json", "not a readable model config", "re-save the model"),
    ),
    Case(
        "train-missing-data-file",
        lambda i: i.train(data_dir=str(i.data_copy(eval_=False))),
        ("data", "missing eval.jsonl"),
    ),
    Case(
        "train-corrupt-jsonl-line",
        lambda i: i.train(data_dir=str(i.data_copy(train=_lines(2) + "{oops\n" + _lines(8)))),
        ("train.jsonl:3: invalid JSON", "each line needs a prompt", "fix or delete that line"),
    ),
    Case(
        "train-jsonl-missing-field",
        lambda i: i.train(data_dir=str(i.data_copy(train=_lines(1) + '{"prompt": "1+1="}\n' + _lines(8)))),
        ("train.jsonl:2: no answer (columns ['prompt'])", "fix or delete that line"),
    ),
    Case(
        "train-jsonl-not-utf8",
        lambda i: i.train(data_dir=str(i.data_copy(train=b"\xff\xfe\x00bad\n"))),
        ("train.jsonl: cannot read", "UTF-8 JSONL"),
    ),
    Case(
        "train-chat-prompts-without-chat-template",
        lambda i: i.train(prompt={"format": "chat"}),
        ("has no chat template", "which prompt.format 'chat' needs", "set prompt.format: plain"),
    ),
    Case(
        "train-auto-reward-unknown-data-source",
        lambda i: i.train(reward={"name": "auto"}),
        ("train.jsonl:1", "no reward for data_source ''", "set reward.name"),
    ),
    Case(
        "train-tokenizer-vocab-mismatch",
        lambda i: i.train(model_dir=str(i.model_copy(vocab_size=16))),
        (
            "tokenizer has 32 tokens but config.json vocab_size is 16",
            "use the tokenizer the model was trained",
        ),
    ),
    Case(
        "train-moe-dim-not-multiple-of-16",
        lambda i: i.train(model_dir=str(i.model_copy(moe_intermediate_size=72))),
        (
            "config.json: moe_intermediate_size=72 is not a multiple of 16",
            "recipe 'minite'",
            "mlp.experts.*.gate_proj/up_proj (out), down_proj (in)",
            "use a model whose moe_intermediate_size is a multiple of 16",
        ),
    ),
    Case(
        "train-hidden-dim-not-multiple-of-16",
        lambda i: i.train("--recipe", "te_nvfp4", model_dir=str(i.model_copy(hidden_size=136))),
        ("hidden_size=136 is not a multiple of 16", "recipe 'te_nvfp4'", "self_attn.q_proj/k_proj/v_proj"),
    ),
    # --- resume -----------------------------------------------------------------------------------
    Case(
        "train-resume-without-checkpoint",
        lambda i: i.train("--resume"),
        ("--resume: no checkpoint in", "out/checkpoint", "run without --resume to start from step 0"),
    ),
    Case(
        "train-resume-corrupted-checkpoint",
        lambda i: i.train("--resume"),
        ("out/checkpoint", "checksum mismatch for model.safetensors", "restore the folder from a copy"),
        setup=lambda i: i.checkpoint(corrupt=True),
    ),
    Case(
        "train-resume-other-recipe",
        lambda i: i.train("--resume"),
        ("written by recipe 'bf16', this run is 'minite'", "resume with the same recipe"),
        setup=lambda i: i.checkpoint(recipe="bf16"),
    ),
    Case(
        "train-resume-weights-only-checkpoint",
        lambda i: i.train("--resume"),
        ("out/checkpoint holds weights only, no optimizer state", "minite train-dist --resume"),
        setup=lambda i: i.checkpoint(),  # like train-dist's consolidated checkpoint
    ),
    Case(
        "train-dist-resume-without-checkpoint",
        lambda i: i.train_dist("--resume"),
        ("--resume: no checkpoint in", "out/checkpoint_sharded", "run without --resume to start from step 0"),
    ),
    Case(
        "train-dist-resume-corrupted-shard",
        lambda i: i.train_dist("--resume"),
        (
            "out/checkpoint_sharded",
            "checksum mismatch for shard-00001-model-00001-of-00001.safetensors",
            "restore the folder from a copy",
        ),
        setup=lambda i: i.sharded_checkpoint(corrupt=True),
    ),
    Case(
        "train-dist-resume-other-recipe",
        lambda i: i.train_dist("--resume"),
        (
            "checkpoint_sharded was written by recipe 'bf16', this run is 'minite'",
            "resume with the same recipe",
        ),
        setup=lambda i: i.sharded_checkpoint(recipe="bf16"),
    ),
    Case(
        "train-dist-resume-minite-train-checkpoint",
        lambda i: i.train_dist("--resume"),
        (
            "no checkpoint in",
            "checkpoint_sharded",
            "a `minite train` run, which `minite train --resume` continues",
        ),
        setup=lambda i: i.checkpoint(),
    ),
    Case(
        "train-tensor-parallel-nvfp4-sampler",
        lambda i: i.train(sampler={"engine": "vllm", "tensor_parallel_size": 2}),
        (
            "sampler.tensor_parallel_size=2 with recipe 'minite'",
            "runs NVFP4 layers unsharded",
            "minite train-dist --nproc-per-node N",
            "use recipe 'bf16'",
        ),
    ),
    # --- the vLLM sampler's memory share (rl.sampler.gpu_memory_utilization) ----------------------
    Case(
        "train-sampler-memory-out-of-range",
        lambda i: i.train(sampler={"engine": "vllm", "gpu_memory_utilization": 1.5}),
        ("run.yaml.sampler", "gpu_memory_utilization must be a fraction in (0, 1], got 1.5"),
    ),
    Case(
        "train-sampler-memory-builtin-engine",
        lambda i: i.train(sampler={"gpu_memory_utilization": 0.3}),
        ("gpu_memory_utilization is a vLLM setting", "set sampler.engine to 'vllm', or drop the key"),
    ),
    Case(
        "eval-sampler-memory-out-of-range",
        lambda i: cli(
            [
                "eval",
                "--base",
                "--model-dir",
                str(i.model_dir),
                "--data-dir",
                str(i.data_dir),
                "--tasks",
                "tiny_arith",
                "--engine",
                "vllm",
                "--gpu-memory-utilization",
                "1.5",
                "--out",
                str(i.out / "e.json"),
            ]
        ),
        ("--gpu-memory-utilization must be a fraction in (0, 1], got 1.5", "leave it out"),
    ),
    # --- recipes (configs/recipes/*.yaml, ablation `recipe:` mappings) ------------------------------
    Case(
        "recipe-unknown-key",
        lambda i: _recipe(i, {"extends": "minite", "trainer": {"fprop_wieght": {}}}),
        ("recipe.yaml.trainer", "unknown key 'fprop_wieght'", "did you mean 'fprop_weight'"),
        ConfigError,
    ),
    Case(
        "recipe-extends-typo",
        lambda i: _recipe(i, {"extends": "minte"}),
        ("unknown recipe 'minte'", "did you mean 'minite'"),
        ConfigError,
    ),
    Case(
        "recipe-wrong-type",
        lambda i: _recipe(i, {"extends": "minite", "trainer": {"bf16_last_blocks": "one"}}),
        ("trainer.bf16_last_blocks", "expected an integer", "'one'"),
        ConfigError,
    ),
    Case(
        "quantspec-bad-block",
        lambda i: _recipe(i, {"extends": "minite", "trainer": {"fprop_weight": {"block": "16x8"}}}),
        ("trainer.fprop_weight.block", "'16x8' is not one of ['1x16', '16x16']"),
        ConfigError,
    ),
    Case(
        "quantspec-bad-scope",
        lambda i: _recipe(i, {"extends": "minite", "trainer": {"fprop_act": {"scope": "rows"}}}),
        ("trainer.fprop_act.scope", "'rows' is not one of", "did you mean 'row'"),
        ConfigError,
    ),
    Case(
        "quantspec-bad-flavor",
        lambda i: _recipe(i, {"extends": "minite", "sampler": {"fprop_act": {"flavor": "tensorrt"}}}),
        ("sampler.fprop_act.flavor", "'tensorrt' is not one of ['canonical', 'te', 'vllm']"),
        ConfigError,
    ),
    Case(
        "quantspec-bad-rounding",
        lambda i: _recipe(i, {"extends": "minite", "trainer": {"dgrad_grad": {"rounding": "stochastc"}}}),
        ("trainer.dgrad_grad.rounding", "did you mean 'stochastic'"),
        ConfigError,
    ),
    Case(
        "quantspec-2d-block-per-row-scale",
        lambda i: _recipe(i, {"extends": "minite", "trainer": {"fprop_weight": {"scope": "row"}}}),
        ("trainer.fprop_weight", "16x16 block spans 16 rows", "per-row global scale is undefined"),
        ConfigError,
    ),
    Case(
        "quantspec-static-scope-in-recipe",
        lambda i: _recipe(i, {"extends": "minite", "trainer": {"fprop_act": {"scope": "static"}}}),
        ("fprop_act: static scope needs calibration",),
        ConfigError,
    ),
    # --- workflow profiles and ablations (what the Snakefile loads before planning) ------------------
    Case(
        "profile-name-typo",
        lambda i: _profile("tinny"),
        ("profile 'tinny'", "configs/tinny.yaml", "did you mean 'tiny'"),
        ConfigError,
    ),
    Case(
        "profile-unknown-key",
        lambda i: _profile("tiny", {"rl": {"stpes": 4}}),
        ("rl.stpes: unknown key 'stpes'", "did you mean 'steps'", "set in --config"),
        ConfigError,
    ),
    Case(
        "profile-wrong-type",
        lambda i: _profile("tiny", {"seeds": "zero"}),
        ("seeds: expected array", "--config 'key=[a,b]'"),
        ConfigError,
    ),
    Case(
        "profile-unknown-ablation",
        lambda i: _profile("tiny", {"ablations": ["minite_tiss"]}),
        ("unknown ablation 'minite_tiss'", "did you mean 'minite_tis'", "configs/ablations/minite_tiss.yaml"),
        ConfigError,
    ),
    Case(
        "ablation-unknown-key",
        lambda i: _ablation(i, "component: other\nrecipe: {extends: minite}\nrl: {grpo: {tiss: true}}\n"),
        ("my_ablation.yaml", "unknown key 'tiss'", "did you mean 'tis'"),
        ConfigError,
    ),
    Case(
        "ablation-unknown-top-key",
        lambda i: _ablation(i, "component: other\nrecipee: {extends: minite}\n"),
        ("my_ablation.yaml", "unknown key 'recipee'", "did you mean 'recipe'"),
        ConfigError,
    ),
    # --- other verbs ------------------------------------------------------------------------------
    Case("cli-unknown-verb", lambda i: cli(["trian"]), ("unknown verb 'trian'", "did you mean 'train'")),
    Case(
        "bench-layers-with-model-dir",
        lambda i: cli(
            [
                "bench",
                "learner",
                "--model-dir",
                str(i.model_dir),
                "--layers",
                "4",
                "--recipes",
                "bf16",
                "--out",
                str(i.out / "learner.json"),
            ]
        ),
        ("--layers 4 with --model-dir", "drop --layers"),
    ),
    Case(
        "resolve-bad-spec-json",
        lambda i: cli(["resolve", "--spec", "{run: minite", "--out", str(i.out)]),
        (
            "--spec is not valid JSON",
            "at line 1 column 2: '{<HERE>run: minite'",  # where it failed
            "--spec takes one JSON object, the run spec of minite.profiles.resolve_run",  # what it wants
            '"run"',
            '"recipe_mapping"',
            "keys and strings in double quotes",
        ),
    ),
    Case(
        "resolve-spec-not-an-object",
        lambda i: cli(["resolve", "--spec", '["minite"]', "--out", str(i.out)]),
        ("--spec is a JSON array, not an object", "--spec takes one JSON object"),
    ),
    Case(
        "resolve-spec-missing-keys",
        lambda i: cli(["resolve", "--spec", '{"run": "minite"}', "--out", str(i.out)]),
        ("--spec: missing key(s) ['recipe_mapping', 'rl']", '"rl" (TrainConfig fields'),
    ),
    Case(
        "prepare-unknown-kind",
        lambda i: _prepare(i, {"kind": "locl"}),
        ("prepare.kind 'locl'", "use 'tiny' or 'local'"),
    ),
    Case(
        "prepare-task-unknown-key",
        lambda i: _prepare(i, {"kind": "tiny", "task": {"n_trian": 10}}),
        ("prepare.task: unknown key 'n_trian'", "did you mean 'n_train'"),
    ),
    Case(
        "prepare-model-unknown-key",
        lambda i: _prepare(i, {"kind": "tiny", "model": {"hiden_size": 64}}),
        ("prepare.model: unknown key 'hiden_size'", "did you mean 'hidden_size'"),
    ),
    Case(
        "prepare-model-dim-not-multiple-of-16",
        lambda i: _prepare(i, {"kind": "tiny", "model": {"moe_intermediate_size": 40}}),
        ("prepare.model", "moe_intermediate_size", "multiples of 16"),
    ),
    Case(
        "prepare-local-missing-model",
        lambda i: _prepare(
            i, {"kind": "local", "model_path": str(i.root / "ckpt"), "data": {"train": "a", "eval": "b"}}
        ),
        ("prepare.model_path", "ckpt", "no config.json"),
    ),
    Case(
        "prepare-local-missing-keys",
        lambda i: _prepare(i, {"kind": "local", "model_path": str(i.model_dir)}),
        ("kind local", "data: {train: FILE, eval: FILE}", "add the missing keys"),
    ),
    Case(
        "prepare-local-row-without-answer",
        lambda i: _prepare(
            i,
            {
                "kind": "local",
                "model_path": str(i.model_dir),
                "data": {
                    "train": str(i.write("local/train.jsonl", _lines(2) + '{"problem": "1+1?"}\n')),
                    "eval": str(i.data_dir / "eval.jsonl"),
                },
            },
        ),
        ("local/train.jsonl:3: no answer", "fix or delete that line"),
    ),
    Case(
        "prepare-qwen3-unknown-model-key",
        lambda i: _prepare(i, {"kind": "qwen3", "model": {"num_layers": 2}, "word_problems": {"n_train": 4}}),
        ("prepare.model: unknown key 'num_layers'", "did you mean"),
    ),
    Case(
        "prepare-qwen3-no-data",
        lambda i: _prepare(i, {"kind": "qwen3", "model": {"num_hidden_layers": 2}}),
        ("give exactly one of data", "word_problems"),
    ),
    Case(
        "prepare-local-corrupt-data",
        lambda i: _prepare(
            i,
            {
                "kind": "local",
                "model_path": str(i.model_dir),
                "data": {
                    "train": str(i.write("local/train.jsonl", _lines(1) + "not json\n")),
                    "eval": str(i.data_dir / "eval.jsonl"),
                },
            },
        ),
        ("local/train.jsonl:2: invalid JSON", "fix or delete that line"),
    ),
]


def _snapshot(root: Path) -> dict[str, str]:
    """Every path under `root` -> content hash (files), link target (links) or "dir"."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = "link:" + str(p.readlink())
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def test_cases_are_many_and_distinct():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)) >= 20


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_fails_before_compute_and_says_the_fix(case, tiny_inputs, tmp_path, capsys):
    inp = Inputs(tmp_path, tiny_inputs)
    before = None
    if case.setup is not None:
        case.setup(inp)
        before = _snapshot(inp.out)
    run = case.run
    if case.error is None:
        try:
            rc = run(inp)
        except SystemExit as e:  # argparse errors
            rc = e.code
        msg = capsys.readouterr().err
        assert rc == 2, f"{case.id}: exit code {rc}, stderr:\n{msg}"
        assert "Traceback" not in msg
    else:
        with pytest.raises(case.error) as info:
            run(inp)
        msg = str(info.value)
    for s in case.expect:
        assert s in msg, f"{case.id}: {s!r} not in message:\n{msg}"
    # (a) before any compute: no output folder, or the existing run folder byte-identical
    if before is None:
        assert not inp.out.exists(), f"{case.id}: wrote {sorted(_snapshot(inp.out))} before failing"
    else:
        assert _snapshot(inp.out) == before, f"{case.id}: the run folder changed"


def test_valid_baseline_passes_the_same_checks(tiny_inputs, tmp_path):
    """The rows above each break one thing of this config; unbroken, it passes every pre-flight check
    (so each failure above is caused by its one mistake), and a bf16 recipe accepts model dims that a
    quantized recipe refuses (the dims check asks the recipe)."""
    from minite.rl.checks import check_inputs
    from minite.rl.config import load_train_config

    inp = Inputs(tmp_path, tiny_inputs)
    check_inputs(load_train_config(inp.yaml("run.yaml", inp.run_config())))
    odd = inp.model_copy(moe_intermediate_size=72)
    check_inputs(load_train_config(inp.yaml("bf16.yaml", inp.run_config(recipe="bf16", model_dir=str(odd)))))
    with pytest.raises(ConfigError, match="moe_intermediate_size=72"):
        check_inputs(load_train_config(inp.yaml("mt.yaml", inp.run_config(model_dir=str(odd)))))
    assert not inp.out.exists()
