"""Prompts through the model's own tokenizer: plain text for the char tokenizer (the tiny task's ids
unchanged), the chat template with add_generation_prompt and enable_thinking for Qwen3, and the stop
ids (EOS, <|im_end|>, the generation config's)."""

from __future__ import annotations

import json

import pytest

from minite.configuration import ConfigError
from minite.rl.data import Example, Message
from minite.rl.prompts import (
    PromptConfig,
    check_chat_template,
    encode_prompt,
    messages,
    render,
    stop_token_ids,
)

INSTRUCTION = "Solve it. Put the answer in \\boxed{}.\n\n{problem}"


@pytest.fixture(scope="module")
def qwen_tok(tmp_path_factory):
    from transformers import AutoTokenizer

    from minite.models.qwen3 import copy_tokenizer

    folder = tmp_path_factory.mktemp("qwen_tok")
    copy_tokenizer(None, folder)
    return AutoTokenizer.from_pretrained(str(folder))


def test_plain_is_the_tiny_tasks_encoding():
    from minite.models.tokenizer import build_tokenizer
    from minite.models.tokenizer import encode_prompt as char_encode

    tok = build_tokenizer()
    assert encode_prompt(tok, Example("12+7-3=", "16"), PromptConfig()) == char_encode(tok, "12+7-3=")
    with pytest.raises(ValueError, match="cannot encode prompt"):
        encode_prompt(tok, Example("12/4=", "3"), PromptConfig())
    with pytest.raises(ConfigError, match="needs prompt.format 'chat'"):
        encode_prompt(tok, Example((Message("user", "1+1="),), "2"), PromptConfig())


def test_chat_matches_the_templates_own_tokenization(qwen_tok):
    cfg = PromptConfig(format="chat", instruction=INSTRUCTION, enable_thinking=False)
    ex = Example("What is $\\frac{1}{2} + \\frac{1}{2}$?", "1")
    msgs = messages(ex, cfg)
    assert msgs == [{"role": "user", "content": INSTRUCTION.replace("{problem}", ex.prompt)}]
    ids = encode_prompt(qwen_tok, ex, cfg)
    want = qwen_tok.apply_chat_template(
        msgs, add_generation_prompt=True, enable_thinking=False, tokenize=True
    )
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    assert ids == list(want)
    text = render(qwen_tok, ex, cfg)
    assert text.startswith("<|im_start|>user\n") and text.endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert ids[:1] == [
        qwen_tok.convert_tokens_to_ids("<|im_start|>")
    ]  # one special token, not its characters


def test_thinking_system_and_given_messages(qwen_tok):
    ex = Example("2+2?", "4")
    on = render(qwen_tok, ex, PromptConfig(format="chat"))
    assert on.endswith("<|im_start|>assistant\n") and "<think>" not in on  # Qwen3's default: the model thinks
    sys = render(qwen_tok, ex, PromptConfig(format="chat", system="Be brief."))
    assert sys.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?")
    given = Example((Message("user", "from the data"),), "4")  # verl rows: the instruction is in them
    assert messages(given, PromptConfig(format="chat", instruction=INSTRUCTION)) == [
        {"role": "user", "content": "from the data"}
    ]


def test_config_errors():
    with pytest.raises(ConfigError, match="must contain '{problem}'"):
        PromptConfig(format="chat", instruction="no placeholder")
    with pytest.raises(ConfigError, match="apply to the chat template"):
        PromptConfig(enable_thinking=False)


def test_no_chat_template_is_refused():
    from minite.models.tokenizer import build_tokenizer

    with pytest.raises(ConfigError, match="has no chat template"):
        check_chat_template(build_tokenizer(), "model_dir m")


def test_stop_ids(qwen_tok, tmp_path):
    from minite.models.tokenizer import build_tokenizer

    assert stop_token_ids(build_tokenizer()) == (2,)  # the tiny task's <eos> alone, as before
    im_end, eot = (qwen_tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>"))
    assert stop_token_ids(qwen_tok) == (im_end,)  # Qwen3's tokenizer EOS is <|im_end|>
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [im_end, eot]}))
    assert stop_token_ids(qwen_tok, tmp_path) == (eot, im_end)
