"""Character-level tokenizer for the synthetic arithmetic task, in Hugging Face format.

Why character level: the arithmetic tasks use 17 characters, so one token per character keeps the
vocabulary (and the embedding / lm_head GEMMs) tiny and makes every answer digit its own decision,
which is what the trainer/sampler log-prob comparison looks at. Why HF format: the trainer
(transformers) and the sampler (vLLM) must load the *same* tokenizer from the checkpoint directory
with their stock loaders (`AutoTokenizer.from_pretrained(dir)`), exactly as for a real Qwen3 model.

Prompt format (what both engines see):
  - prompt text "12+7-3=" -> ids [<bos>, '1', '2', '+', '7', '-', '3', '=']
    (`tokenizer(prompt)` / `encode_prompt`: the post-processor prepends <bos>);
  - completion = answer characters followed by <eos>: "16" -> ['1', '6', <eos>] (`encode_completion`);
    generation stops at <eos>, and decoding with `skip_special_tokens=True` gives back "16".

Vocabulary: ids 0..2 are <pad>, <bos>, <eos>; then the characters of `CHARS`; then reserved
`<unused{i}>` specials that pad the size to a multiple of 16. The padding makes the model's vocab
(a multiple of 16 for NVFP4 blocks) equal to the tokenizer's size, so every id a sampler can emit
decodes to a known token.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from minite.rl.task import END_OF_ANSWER

PAD, BOS, EOS = "<pad>", "<bos>", END_OF_ANSWER
SPECIALS = (PAD, BOS, EOS)
#: Characters of the tasks, one token each: digits, operators, "=", space; then the scratchpad's step
#: separator ";" and answer marker "#" (minite.rl.scratchpad_task), appended so every earlier id is unchanged.
CHARS = "0123456789+-*= ;#"
VOCAB_MULTIPLE = 16


def _vocab(multiple: int) -> dict[str, int]:
    tokens = list(SPECIALS) + list(CHARS)
    n_unused = -len(tokens) % multiple
    tokens += [f"<unused{i}>" for i in range(n_unused)]
    return {tok: i for i, tok in enumerate(tokens)}


def build_tokenizer(multiple: int = VOCAB_MULTIPLE) -> PreTrainedTokenizerFast:
    """Build the char-level tokenizer (deterministic; same ids every time)."""
    vocab = _vocab(multiple)
    # WordLevel on single characters: an unknown character is an error (no <unk> on purpose).
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A $B",
        special_tokens=[(BOS, vocab[BOS])],
    )
    tok.decoder = decoders.Fuse()  # concatenate characters, no separators
    specials = [t for t in vocab if t.startswith("<")]
    tok.add_special_tokens(specials)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        padding_side="right",
        model_max_length=256,
        clean_up_tokenization_spaces=False,
    )


def _check_chars(text: str) -> None:
    unknown = sorted(set(text) - set(CHARS))
    if unknown:
        raise ValueError(f"characters {unknown} of {text!r} are not in the tokenizer vocabulary {CHARS!r}")


def encode_prompt(tokenizer: PreTrainedTokenizerFast, prompt: str) -> list[int]:
    """Prompt ids: <bos> followed by one id per character."""
    _check_chars(prompt)
    return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])


def encode_completion(tokenizer: PreTrainedTokenizerFast, answer: str) -> list[int]:
    """Target completion ids: one id per answer character, then <eos>."""
    _check_chars(answer)
    return list(tokenizer(answer, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: str | Path) -> None:
    """Write tokenizer.json + tokenizer_config.json (loadable by AutoTokenizer and vLLM)."""
    tokenizer.save_pretrained(str(out_dir))
