"""The `minite` model for lm-eval: a run's policy served by the run recipe's sampler engine.

Why not lm-eval's `hf` or `vllm` models: they would evaluate the checkpoint with *their* numerics
(bf16 transformers, or stock vLLM), not the recipe's. Here the policy is rebuilt as the RL loop built
it (recipe.trainer numerics, the run's final checkpoint), its weights cross to the recipe's sampler
engine through the same `export_weights` sync, and generation runs on that engine (built-in, or vLLM
with the minite plugin). An eval number is therefore the number of the policy *as the recipe samples
it*.

    lm_eval.simple_evaluate(model="minite", model_args={"run": "results/tiny/rl/minite/seed0",
                            "model_dir": "results/tiny/prepare/base_model"}, tasks=[...])

model_args: run (RL output folder; omit to evaluate the base model), model_dir (base model: config
and tokenizer), recipe (default: the run's; "bf16" for the base model), engine (builtin|vllm, default
the run's sampler engine), dtype, seed, max_model_len, max_gen_toks (default cap), batch_size, chat
(render prompts with the tokenizer's chat template; default: the run's rl.prompt.format is chat),
enable_thinking (passed to the template; default the run's rl.prompt.enable_thinking),
gpu_memory_utilization (vLLM's share; default the run's rl.sampler.gpu_memory_utilization, else
derived from the machine: minite.engines.vllm.memory).

Chat: lm-eval calls `apply_chat_template` with the task's messages (its prompt, few-shot turns with
`fewshot_as_multiturn`, a system instruction) when `simple_evaluate(apply_chat_template=True)`; the
model renders them with the checkpoint's own template, `add_generation_prompt=True`, and encodes the
text without adding special tokens again, exactly as the RL loop renders its prompts
(minite.rl.prompts). Generation stops at EOS and the template's end-of-turn token (<|im_end|>) in
either engine, then at the task's `until` strings in the decoded text (special tokens skipped).

Only `generate_until` is implemented (greedy unless a task asks for sampling): the tasks miniTE
evaluates (tiny arithmetic, AIME, MATH-500) are generative and exact-match scored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from minite.engines.base import SamplingParams
from minite.rl.prompts import check_chat_template, stop_token_ids


def _int(v: Any, default: int) -> int:
    return default if v in (None, "", "auto") else int(v)


def _flag(v: Any) -> bool | None:
    """A model_args boolean (lm-eval passes strings from the command line)."""
    if v is None or v == "":
        return None
    if isinstance(v, str):
        if v.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"minite lm-eval model: expected true or false, got {v!r}")
        return v.lower() in ("true", "1")
    return bool(v)


@register_model("minite")
class MiniteLM(LM):
    def __init__(
        self,
        run: str | None = None,
        model_dir: str | None = None,
        recipe: str | None = None,
        engine: str | None = None,
        dtype: str | None = None,
        seed: int = 0,
        max_model_len: int | None = None,
        max_gen_toks: int = 256,
        batch_size: int | str | None = 64,
        max_batch_size: int | None = None,
        device: str | None = None,
        chat: bool | str | None = None,
        enable_thinking: bool | str | None = None,
        gpu_memory_utilization: float | str | None = None,
        **_: Any,
    ) -> None:
        super().__init__()
        from transformers import AutoTokenizer

        from minite.recipes import get_recipe
        from minite.rl.reopen import build_sampler, load_policy, read_run_config, run_checkpoint, sync

        run_cfg = read_run_config(run) if run else {}
        model_dir = model_dir or run_cfg.get("model_dir")
        if not model_dir:
            raise ValueError("minite lm-eval model: give model_dir (base model folder) or a run with one")
        sampler_cfg = run_cfg.get("sampler", {})
        self.recipe = get_recipe(recipe or run_cfg.get("recipe", "bf16"))
        self.engine = engine or sampler_cfg.get("engine", "builtin")
        self.seed = int(seed)
        self.max_gen_toks = int(max_gen_toks)
        self.batch_size_ = _int(batch_size, 64)
        self.max_model_len = _int(max_model_len, sampler_cfg.get("max_model_len", 256))
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        prompt = run_cfg.get("prompt") or {}
        self.chat = _flag(chat)
        if self.chat is None:
            self.chat = prompt.get("format") == "chat"
        self.enable_thinking = _flag(enable_thinking)
        if self.enable_thinking is None:
            self.enable_thinking = prompt.get("enable_thinking")
        if self.chat:
            check_chat_template(self.tokenizer, f"model_dir {model_dir}")
        self.stop_ids = stop_token_ids(self.tokenizer, model_dir)
        checkpoint = run_checkpoint(run) if run else None
        policy = load_policy(model_dir, self.recipe, checkpoint, seed=self.seed)
        self.sampler = build_sampler(
            self.engine,
            model_dir,
            self.recipe,
            self.tokenizer,
            dtype=dtype or sampler_cfg.get("dtype", "bfloat16"),
            seed=self.seed,
            max_model_len=self.max_model_len,
            workdir=Path(run) / "eval_sampler" if run else None,
            gpu_memory_utilization=(
                float(gpu_memory_utilization)
                if gpu_memory_utilization not in (None, "")
                else sampler_cfg.get("gpu_memory_utilization")
            ),
        )
        sync(self.sampler, policy, self.recipe)
        del policy
        self.run = run
        self.model_dir = str(model_dir)

    # lm-eval's hooks for result metadata
    @property
    def tokenizer_name(self) -> str:
        return self.model_dir

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.tokenizer.chat_template if self.chat else ""

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """The task's messages as the checkpoint's chat template renders them (module docstring)."""
        if not self.chat:
            raise ValueError(
                "lm-eval asked for the chat template but the minite model runs with chat=false; pass "
                "model_args chat=true (minite eval --chat-template), or run lm-eval without "
                "apply_chat_template"
            )
        extra = {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}
        return self.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
        )

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy (or task-requested sampled) generation with the recipe's sampler engine."""
        out: list[str | None] = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for i, req in enumerate(requests):
            _, gen = req.args
            key = (
                int(gen.get("max_gen_toks", self.max_gen_toks)),
                float(gen.get("temperature", 0.0)) if gen.get("do_sample", False) else 0.0,
                tuple(gen.get("until", []) or []),
            )
            groups.setdefault(key, []).append(i)
        for (max_toks, temp, until), idx in groups.items():
            for start in range(0, len(idx), self.batch_size_):
                chunk = idx[start : start + self.batch_size_]
                prompts = [self._encode(requests[i].args[0]) for i in chunk]
                room = self.max_model_len - max(len(p) for p in prompts)
                if room < 1:
                    raise ValueError(
                        f"a prompt of {max(len(p) for p in prompts)} tokens does not fit max_model_len "
                        f"{self.max_model_len}; raise it (model_args max_model_len=...)"
                    )
                params = SamplingParams(
                    n=1,
                    max_new_tokens=min(max_toks, room),
                    temperature=temp,
                    seed=self.seed,
                    stop_token_ids=self.stop_ids,
                )
                groups_out = self.sampler.generate(prompts, params)
                for i, g in zip(chunk, groups_out, strict=True):
                    text = self.tokenizer.decode(g[0].token_ids, skip_special_tokens=True)
                    for stop in until:
                        if stop and stop in text:
                            text = text.split(stop, 1)[0]
                    out[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return [o if o is not None else "" for o in out]

    def _encode(self, text: str) -> list[int]:
        # a rendered chat prompt already holds the template's special tokens
        return list(self.tokenizer(text, add_special_tokens=not self.chat)["input_ids"])

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError(
            "the minite lm-eval model implements generate_until only (generation with the recipe's "
            "sampler engine); choose generative tasks (output_type: generate_until)"
        )

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        self.loglikelihood(requests)

    def close(self) -> None:
        if getattr(self, "sampler", None) is not None:
            self.sampler.close()
            self.sampler = None
