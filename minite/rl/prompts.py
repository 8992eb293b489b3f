"""Prompt token ids from an `Example` and the model's own tokenizer, and where generation stops.

Two formats (`PromptConfig.format`, `rl.prompt.format` in a profile):
- `plain`: the prompt text as the tokenizer encodes it with its special tokens (the tiny task's
  character tokenizer prepends <bos>: "12+7=" -> [<bos>, '1', '2', '+', '7', '=']).
- `chat`: chat messages rendered by the tokenizer's own chat template with
  `apply_chat_template(messages, add_generation_prompt=True)`, then encoded without adding special
  tokens again (the template wrote them). The messages are the example's own (verl data carries them,
  instruction included) or one user message, `instruction` with `{problem}` replaced by the problem
  text, after an optional `system` message. `enable_thinking` is passed to the template when set
  (Qwen3: False renders an empty <think></think> block, so the model answers directly).

The text is rendered, then encoded (not `tokenize=True`), so the RL loop and the lm-eval model (which
receives rendered text from lm-eval) produce the same ids for the same messages.

Stops: the tokenizer's EOS, the template's end-of-turn token (`<|im_end|>` for Qwen's ChatML) and the
checkpoint's generation_config.json `eos_token_id` list (Qwen3: <|im_end|> and <|endoftext|>); both
sampler engines stop at any of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from minite.configuration import ConfigError
from minite.rl.data import Example

PROBLEM = "{problem}"
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>")


@dataclass(frozen=True)
class PromptConfig:
    format: Literal["plain", "chat"] = "plain"
    # the user message for an example given as text: {problem} is replaced by the problem (str.replace,
    # so LaTeX braces in problems are safe)
    instruction: str = PROBLEM
    system: str | None = None
    # passed to the chat template when not None (Qwen3's switch for its <think> block)
    enable_thinking: bool | None = None

    def __post_init__(self) -> None:
        if PROBLEM not in self.instruction:
            raise ConfigError(
                f"prompt.instruction must contain {PROBLEM!r} (where the problem text goes), got "
                f"{self.instruction[:80]!r}"
            )
        if self.format == "plain" and (self.system is not None or self.enable_thinking is not None):
            raise ConfigError(
                "prompt.system and prompt.enable_thinking apply to the chat template: set prompt.format "
                "to 'chat', or drop them"
            )

    def template_kwargs(self) -> dict[str, Any]:
        return {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}


def messages(example: Example, cfg: PromptConfig) -> list[dict[str, str]]:
    """The chat messages of `example` (its own, or the instruction around its text)."""
    if example.is_chat:
        return [{"role": m.role, "content": m.content} for m in example.prompt]
    out = [{"role": "system", "content": cfg.system}] if cfg.system is not None else []
    return [*out, {"role": "user", "content": cfg.instruction.replace(PROBLEM, example.prompt)}]


def check_chat_template(tokenizer, where: str) -> None:
    """ConfigError when `tokenizer` has no chat template (run before any compute)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"{where}: the tokenizer has no chat template (tokenizer_config.json `chat_template` or "
            "chat_template.jinja), which prompt.format 'chat' needs; use the checkpoint's own tokenizer "
            "files, or set prompt.format: plain"
        )


def render(tokenizer, example: Example, cfg: PromptConfig) -> str:
    """The chat-format prompt as text (generation prompt appended)."""
    return tokenizer.apply_chat_template(
        messages(example, cfg), tokenize=False, add_generation_prompt=True, **cfg.template_kwargs()
    )


def encode_prompt(tokenizer, example: Example, cfg: PromptConfig) -> list[int]:
    """Prompt token ids of `example` in `cfg.format` (module docstring)."""
    if cfg.format == "chat":
        return list(tokenizer(render(tokenizer, example, cfg), add_special_tokens=False)["input_ids"])
    if example.is_chat:
        raise ConfigError(
            "an example with chat messages (verl data) needs prompt.format 'chat'; set it in rl.prompt"
        )
    try:
        return list(tokenizer(example.prompt, add_special_tokens=True)["input_ids"])
    except Exception as e:  # the char tokenizer refuses unknown characters
        raise ValueError(f"cannot encode prompt {example.prompt[:80]!r} with this tokenizer: {e}") from e


def stop_token_ids(tokenizer, model_dir: str | Path | None = None) -> tuple[int, ...]:
    """EOS, the end-of-turn token the tokenizer knows, and the generation config's eos ids, sorted."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    ids.update(int(vocab[t]) for t in END_OF_TURN_TOKENS if t in vocab)
    gen = Path(model_dir) / "generation_config.json" if model_dir is not None else None
    if gen is not None and gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        if eos is not None:
            ids.update(int(e) for e in (eos if isinstance(eos, list) else [eos]))
    return tuple(sorted(ids))
