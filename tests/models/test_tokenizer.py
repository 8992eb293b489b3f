"""Char-level tokenizer: ids layout, prompt/completion format, HF save/load roundtrip."""

import pytest
from transformers import AutoTokenizer

from minite.models.tokenizer import CHARS, build_tokenizer, encode_completion, encode_prompt, save_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_specials_and_size(tok):
    assert (tok.pad_token, tok.bos_token, tok.eos_token) == ("<pad>", "<bos>", "<eos>")
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert len(tok) % 16 == 0
    assert len(tok) >= 3 + len(CHARS)


def test_one_token_per_char(tok):
    for ch in CHARS:
        ids = tok(ch, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and tok.convert_ids_to_tokens(ids) == [ch]


def test_prompt_and_completion_format(tok):
    p = encode_prompt(tok, "12+7-3=")
    assert p[0] == tok.bos_token_id and len(p) == 1 + len("12+7-3=")
    c = encode_completion(tok, "16")
    assert c[-1] == tok.eos_token_id and len(c) == 3
    assert tok.decode(p + c) == "<bos>12+7-3=16<eos>"
    assert tok.decode(p + c, skip_special_tokens=True) == "12+7-3=16"
    assert tok("1 2=")["input_ids"] == encode_prompt(tok, "1 2=")


def test_unknown_character_is_an_error(tok):
    with pytest.raises(ValueError, match="not in the tokenizer vocabulary"):
        encode_prompt(tok, "1/2=")


def test_every_id_decodes(tok):
    # reserved ids (vocab padding) decode as specials, so a sampler can never emit an undecodable id
    assert all(t is not None for t in tok.convert_ids_to_tokens(list(range(len(tok)))))
    assert tok.decode(list(range(len(tok))), skip_special_tokens=True) == CHARS


def test_build_is_deterministic(tok):
    assert build_tokenizer().get_vocab() == tok.get_vocab()


def test_save_load_roundtrip(tok, tmp_path):
    save_tokenizer(tok, tmp_path)
    assert (tmp_path / "tokenizer.json").exists()
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.get_vocab() == tok.get_vocab()
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (0, 1, 2)
    for text in ["12+7-3=", "0*9 ="]:
        assert loaded(text)["input_ids"] == tok(text)["input_ids"]
    ids = encode_prompt(tok, "5+5=") + encode_completion(tok, "10")
    assert loaded.decode(ids, skip_special_tokens=True) == "5+5=10"
