"""`VLLMSampler`: the `Sampler` protocol (minite/engines/base.py) on a running vLLM engine.

Choices, and why:
- In-process engine (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set before the engine starts): weight syncs
  hand tensors to the worker by reference (no serialization, no copy through a socket), and tests can
  inspect the live model (`VLLMSampler.model`). The whole engine lives in this Python process; guard
  scripts with `if __name__ == "__main__":` all the same, vLLM may spawn helpers.
- Log-probs: `LLM(logprobs_mode="processed_logprobs")` + `SamplingParams(logprobs=0)`. vLLM 0.32 offers
  raw_logprobs / raw_logits / processed_logprobs / processed_logits; "raw" is the fp32 log-softmax of
  the model's logits before any logits processing (temperature, top-p/top-k, penalties), "processed"
  that of the logits the token was drawn from: fp32 logits divided by the request's temperature
  (`logits.div_(temp)`, an IEEE fp32 division) and top-p/top-k-filtered, then
  `log_softmax(dtype=float32)`. Processed is the distribution sampled from, and what the trainer
  recomputes at the same temperature (minite.engines.base.temper: the same division, the same fp32
  log-softmax), so an aligned recipe keeps its bitwise equality at any T. At T = 1 vLLM divides by
  1.0, which changes no bit, so the two modes agree there. Greedy requests (T = 0, evals) skip the
  temperature: their log-probs are the untempered log-softmax (minite.engines.base). `top_p` < 1
  would truncate the reported distribution (−inf outside the nucleus), which no trainer recompute
  reproduces; the RL loop samples at top_p 1. With logprobs=0 vLLM returns only the sampled token's
  entry. `score` (prompt log-probs) is untempered in either mode: vLLM computes prompt log-probs
  from the raw logits.
- Prompts are token ids (`TokensPrompt`) and the engine runs without a tokenizer
  (`skip_tokenizer_init=True`): the RL loop owns tokenization. EOS ids come from the checkpoint's
  generation_config.json / config.json and are passed as stop tokens (kept in the output).
- Seeds: each prompt's request gets seed `params.seed * 1_000_003 + i * n` and vLLM gives its j-th
  child `+ j`, so every completion draws from its own seeded stream and a batch is reproducible
  whatever else is in it.
- Weight updates (`update_weights`) use vLLM 0.32's in-place reload, `collective_rpc("reload_weights",
  weights_iterator=..., is_checkpoint_format=True)`: per layer it restores the parameters in checkpoint
  format, replays the weight loaders and re-runs the quant method's `process_weights_after_loading`
  (CPU weight repacking for vLLM's own layers, the checks of the minite plugin), then copies the
  result into the original storage. The engine is not restarted. The prefix cache is reset afterwards
  so no KV computed with the old weights is reused. vLLM reloads a layer only as a whole, so an update
  that touches one member of a fused layer (q/k/v, one MoE layer's experts) must carry all of them;
  `update_weights` checks that (and every name) before anything is loaded. On CPU, vLLM 0.32's own
  bf16 MoE layers need a workaround to re-prepack their expert weights (`_cpu_moe_reload`).
- `fp32_norm`: the model's RMSNorm modules are switched to the trainer's fp32 norm (minite.nn.rms_norm
  `rms_norm_fp32`) in place, in-process (`_fp32_rms_norm`); the quantization plugin cannot reach norms.
- `rope="fp32"`: each attention module's `rotary_emb` is replaced by `_Fp32Rope`
  (minite.nn.aligned_attention's table and arithmetic, the code the trainer runs). vLLM's own CPU
  rotary op computes the same float32 values; it rounds them to bf16 to nearest even on AVX-512 CPUs but
  toward zero on AVX2 ones (tests/nn/test_aligned_attention.py). The swap makes the trainer's rounding hold
  on every platform. The module is replaced on this model's attention layers only: vLLM caches rotary
  modules process-wide (`get_rope`), so the shared instance itself is never modified.
- `attention="fixed"`: each attention layer's backend implementation gets instance-level `forward` /
  `do_kv_cache_update` that compute minite's fixed attention core against the paged cache, the core the
  trainer runs on whole sequences: minite.engines.vllm.paged_fixed_attention (the Triton kernels on
  CUDA, the float64 core on CPU).
- Under torchrun (`minite train-dist`) the engine joins the learner's process group through vLLM's
  `distributed_executor_backend="external_launcher"` (every rank builds an engine; ranks r·tp..r·tp+tp-1
  form one tensor-parallel engine; the engines are independent replicas otherwise).
  `generate(..., first_index=i)` seeds a slice of a batch as the whole batch would be seeded, so
  replicas that each sample a slice draw exactly what one engine draws for the whole batch. `close()`
  then releases vLLM's groups but leaves the learner's default process group alone.
- Eager mode (`enforce_eager=True`) by default: the minite plugin's pure-torch NVFP4 path has
  data-dependent Python control flow, and on CPU compilation costs more start time than it saves.
- Memory (minite.engines.vllm.memory): unless the caller gives `gpu_memory_utilization`, the engine's
  share comes from the machine and from how many engines run at once (`engines`, default
  MINITE_VLLM_ENGINES, which the workflow sets), and on CPU its KV cache is sized to the work. Before
  vLLM is imported the platform is checked, and before the engine starts the memory it will take is
  checked against what is available; a start that cannot work, or a vLLM start error of a known
  cause, raises EngineStartError naming the cause and the fix (minite.engines.vllm.startup). The
  plan is `VLLMSampler.memory`, and one line on stderr says it once the engine is up.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import gc
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from minite.configuration import ConfigError
from minite.engines.base import Completion, SamplingParams, WeightUpdate
from minite.engines.vllm import memory, startup
from minite.engines.vllm.layout import PACKED_SUFFIXES, fused_group, module_is_quantized, quantization_config
from minite.engines.vllm.paged_fixed_attention import apply_fixed_attention
from minite.nn.rms_norm import rms_norm_fp32
from minite.recipes import Recipe, get_recipe

LOGPROBS_MODE = "processed_logprobs"  # the sampled distribution (module docstring)


def _checkpoint_tensor_names(model_dir: Path) -> list[str]:
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors files")
    names: list[str] = []
    for f in files:
        with safe_open(str(f), "pt") as fh:
            names.extend(fh.keys())
    return names


def _eos_ids(model_dir: Path, cfg: dict[str, Any]) -> list[int]:
    eos = None
    gen = model_dir / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
    if eos is None:
        eos = cfg.get("eos_token_id")
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, list) else [eos])]


def _cpu_moe_reload(model: torch.nn.Module, stage: str) -> None:
    """Work around a vLLM 0.32 CPU bug: on reload, `UnquantizedFusedMoEMethod` sees its kernel already
    built, copies the new expert weights in unpacked and skips the CPU backend's prepack, so bf16 MoE
    layers compute garbage after an update. Before the reload ("prepare") the kernel is set aside, so a
    reloaded layer takes the first-load path (prepack + kernel build; the result is then copied into
    the original storage as usual); afterwards ("finish") layers the update did not touch get their
    kernel back."""
    from vllm.model_executor.layers.fused_moe import RoutedExperts, UnquantizedFusedMoEMethod
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if not (isinstance(module, RoutedExperts) and isinstance(method, UnquantizedFusedMoEMethod)):
            continue
        if stage == "prepare":
            method._minite_kernel, method.moe_kernel = method.moe_kernel, None
        else:
            saved = method.__dict__.pop("_minite_kernel", None)
            if method.moe_kernel is None:
                method.moe_kernel = saved


def _fp32_rms_norm(module: torch.nn.Module, x: torch.Tensor, residual: torch.Tensor | None = None):
    """vLLM RMSNorm call (optionally fused with the residual add) with the trainer's numerics: the
    residual add in the activation dtype as transformers does it, then minite.nn.rms_norm `rms_norm_fp32`
    (normalize and multiply by the weight in fp32, one cast at the end). vLLM's own op normalizes the
    unrounded fp32 sum and multiplies by the weight in the activation dtype."""
    if residual is not None:
        x = residual + x
        residual = x
    out = rms_norm_fp32(x, module.weight if module.has_weight else None, module.variance_epsilon)
    return out if residual is None else (out, residual)


def _apply_fp32_norm(model: torch.nn.Module) -> int:
    from vllm.model_executor.layers.layernorm import RMSNorm

    count = 0
    for module in model.modules():
        if type(module) is RMSNorm:  # not subclasses (e.g. Gemma's 1 + w variant)
            if module.variance_size_override is not None:
                raise NotImplementedError("fp32_norm: RMSNorm with var_hidden_size")
            module.forward = functools.partial(_fp32_rms_norm, module)
            count += 1
    return count


class _Fp32Rope(torch.nn.Module):
    """Replaces a vLLM `RotaryEmbedding` (call `(positions, query, key) -> (query, key)`, flattened
    heads) with minite.nn.aligned_attention's fp32 RoPE from the same table vLLM builds."""

    def __init__(self, rope: torch.nn.Module) -> None:
        from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

        from minite.nn.aligned_attention import RopeTable

        super().__init__()
        if type(rope) is not RotaryEmbedding or not rope.is_neox_style or rope.rotary_dim != rope.head_size:
            found = {k: getattr(rope, k, None) for k in ("is_neox_style", "rotary_dim", "head_size")}
            raise NotImplementedError(
                f"rope='fp32' in vLLM: needs default neox RoPE over the whole head, got "
                f"{type(rope).__name__} {found}"
            )
        self.head_size = rope.head_size
        self.table = RopeTable(rope.base, rope.rotary_dim, rope.max_position_embeddings)

    def extra_repr(self) -> str:
        return f"head_size={self.head_size}, minite fp32"

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None = None):
        from minite.nn.aligned_attention import apply_rope_fp32

        positions = positions.flatten()
        t = positions.shape[0]
        cos, sin = self.table.cos_sin(positions, query.dtype)  # (T, d/2)
        cos, sin = cos[:, None], sin[:, None]
        q = apply_rope_fp32(query.view(t, -1, self.head_size), cos, sin).view(query.shape)
        if key is None:
            return q, None
        k = apply_rope_fp32(key.view(t, -1, self.head_size), cos, sin).view(key.shape)
        return q, k


def _apply_rope_fp32(model: torch.nn.Module) -> int:
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbeddingBase

    owners = [m for m in model.modules() if isinstance(getattr(m, "rotary_emb", None), RotaryEmbeddingBase)]
    for module in owners:
        module.rotary_emb = _Fp32Rope(
            module.rotary_emb
        )  # this model's attribute; the cached instance is untouched
    return len(owners)


class VLLMSampler:
    """Sampler on vLLM; see the module docstring. `recipe` is a Recipe or a registered name."""

    def __init__(
        self,
        model_dir: str | Path,
        recipe: Recipe | str,
        *,
        dtype: str = "bfloat16",
        seed: int = 0,
        max_model_len: int = 1024,
        enforce_eager: bool = True,
        engines: int | None = None,
        learner_on_device: bool = False,
        **engine_kwargs: Any,
    ) -> None:
        """`engines`: vLLM engines that run at once on this device, this one included (default
        MINITE_VLLM_ENGINES, else 1); `learner_on_device`: the learner shares this engine's GPU (a
        smaller share there). `gpu_memory_utilization` in `engine_kwargs` is the user's share and wins."""
        self.recipe = recipe if isinstance(recipe, Recipe) else get_recipe(recipe)
        self.model_dir = Path(model_dir)
        cfg = json.loads((self.model_dir / "config.json").read_text())
        self.num_layers = int(cfg["num_hidden_layers"])
        expected = quantization_config(self.recipe.sampler, self.num_layers)
        found = cfg.get("quantization_config")
        if found != expected:
            raise ConfigError(
                f"{self.model_dir}/config.json quantization_config does not match recipe "
                f"{self.recipe.name!r}'s sampler (found {found!r}, expected {expected!r}); "
                "write the directory with minite.engines.vllm.hf_export.write_sampler_checkpoint"
            )
        self.eos_ids = _eos_ids(self.model_dir, cfg)
        self._modules = self._checkpoint_modules()
        self.version = 0
        self.external_launcher = engine_kwargs.get("distributed_executor_backend") == "external_launcher"

        spec = self.recipe.sampler
        if not enforce_eager and (spec.rope != "native" or spec.attention != "native"):
            # the swaps below act on the eager model; a compiled graph would keep vLLM's own ops
            raise ConfigError("VLLMSampler: the recipe's rope / attention swaps need enforce_eager=True")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process: see module docstring
        t0 = time.perf_counter()
        startup.check_platform()
        try:
            from vllm import LLM
        except ImportError as e:
            raise startup.EngineStartError(
                f"vLLM cannot be imported ({e}): reinstall it (`bash scripts/setup.sh`), "
                f"{startup.BUILTIN_FIX}"
            ) from e

        from minite.engines.vllm.plugin import register

        register()
        self.memory = memory.plan(
            self.model_dir,
            max_model_len=max_model_len,
            dtype=dtype,
            user_share=engine_kwargs.pop("gpu_memory_utilization", None),
            engines=engines,
            learner_on_device=learner_on_device,
        )
        startup.check(self.memory)
        try:
            self.llm = LLM(
                model=str(self.model_dir),
                dtype=dtype,
                seed=seed,
                max_model_len=max_model_len,
                skip_tokenizer_init=True,
                logprobs_mode=LOGPROBS_MODE,
                enforce_eager=enforce_eager,
                **self.memory.engine_kwargs(),
                **engine_kwargs,
            )
        except Exception as e:
            known = startup.explain(e, self.memory)
            if known is None:
                raise
            raise known from e
        spec = self.recipe.sampler
        if spec.fp32_norm:
            self.llm.apply_model(_apply_fp32_norm)
        for wanted, swap in (
            (spec.rope == "fp32", _apply_rope_fp32),
            (spec.attention == "fixed", apply_fixed_attention),
        ):
            if wanted and not all(self.llm.apply_model(swap)):
                raise NotImplementedError(f"{swap.__name__}: found no layer to swap in {self.model_dir}")
        self.start_seconds = time.perf_counter() - t0
        up = datetime.datetime.now().isoformat(timespec="seconds")
        print(
            f"minite: vLLM engine ({self.recipe.name}) up at {up} after {self.start_seconds:.1f} s; "
            f"{self.memory.describe()}",
            file=sys.stderr,
            flush=True,
        )

    # --- introspection ---------------------------------------------------------------------------------

    @property
    def model(self) -> torch.nn.Module:
        """The live vLLM model (in-process engine only)."""
        return self.llm.llm_engine.collective_rpc("get_model")[0]

    def _checkpoint_modules(self) -> dict[str, set[str]]:
        mods: dict[str, set[str]] = defaultdict(set)
        for name in _checkpoint_tensor_names(self.model_dir):
            module, _, suffix = name.rpartition(".")
            mods[module].add(suffix)
        return dict(mods)

    # --- Sampler protocol ------------------------------------------------------------------------------

    def _request_params(self, params: SamplingParams, index: int):
        from vllm import SamplingParams as VllmSamplingParams

        return VllmSamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            seed=(params.seed * 1_000_003 + index * params.n) % (2**62),
            logprobs=0,
            stop_token_ids=sorted(set(self.eos_ids) | set(params.stop_token_ids)),
            detokenize=False,
        )

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, *, first_index: int = 0
    ) -> list[list[Completion]]:
        """`first_index`: the index of `prompts[0]` in the whole batch (seeds depend on it), for an
        engine that samples one slice of a batch (data-parallel replicas under train-dist)."""
        from vllm.inputs import TokensPrompt

        if not prompts:
            return []
        reqs = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]
        sps = [self._request_params(params, first_index + i) for i in range(len(prompts))]
        outs = self.llm.generate(reqs, sps, use_tqdm=False)
        result = []
        for prompt, out in zip(prompts, outs, strict=True):
            comps = []
            for o in sorted(out.outputs, key=lambda o: o.index):
                toks = list(o.token_ids)
                if o.logprobs is None or len(o.logprobs) != len(toks):
                    raise RuntimeError("vLLM returned no per-token log-probs for a completion")
                lps = [float(lp[t].logprob) for t, lp in zip(toks, o.logprobs, strict=True)]
                comps.append(
                    Completion(
                        prompt_ids=list(prompt),
                        token_ids=toks,
                        logprobs=lps,
                        finished=o.finish_reason == "stop",
                    )
                )
            result.append(comps)
        return result

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """Sampler log-prob of every token of each sequence given its prefix (tokens 1..T-1), from
        vLLM's prompt log-probs (raw, temperature 1: prompt tokens never go through logits processors)."""
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt

        sp = VllmSamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=[int(t) for t in s]) for s in sequences], sp, use_tqdm=False
        )
        return [
            [float(lp[t].logprob) for t, lp in zip(seq[1:], out.prompt_logprobs[1:], strict=True)]
            for seq, out in zip(sequences, outs, strict=True)
        ]

    def prefill(self, sequences: list[list[int]]) -> None:
        """Run every sequence through the model once, as a prompt, for forward hooks registered on
        `self.model` (minite.diagnostics.vllm_trace): in groups that fit one scheduler step (so no
        sequence is split by chunked prefill), the prefix cache reset before each group and no two
        sequences of a group sharing a first KV block (so every token of every sequence is computed),
        one token generated per sequence (no decode step)."""
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt

        cfg = self.llm.llm_engine.vllm_config
        budget = cfg.scheduler_config.max_num_batched_tokens
        max_seqs = cfg.scheduler_config.max_num_seqs
        block = cfg.cache_config.block_size
        groups: list[list[list[int]]] = [[]]
        used, heads = 0, set()
        for s in sequences:
            if len(s) > budget:
                raise ValueError(f"prefill: a {len(s)}-token sequence exceeds one step ({budget} tokens)")
            head = tuple(s[:block]) if len(s) >= block else None
            if groups[-1] and (used + len(s) > budget or len(groups[-1]) >= max_seqs or head in heads):
                groups.append([])
                used, heads = 0, set()
            groups[-1].append([int(t) for t in s])
            used += len(s)
            if head is not None:
                heads.add(head)
        sp = VllmSamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
        for group in groups:
            if group:
                self.llm.reset_prefix_cache()
                self.llm.generate([TokensPrompt(prompt_token_ids=s) for s in group], sp, use_tqdm=False)
        self.llm.reset_prefix_cache()

    def check_update(self, update: WeightUpdate) -> None:
        """Raise ValueError unless `update` names known modules with complete tensor sets (see module
        docstring); run before anything is loaded so a bad update leaves the engine untouched."""
        spec = self.recipe.sampler
        got: dict[str, set[str]] = defaultdict(set)
        errors: list[str] = []
        for name in update.tensors:
            module, _, suffix = name.rpartition(".")
            if module not in self._modules:
                errors.append(f"{name}: unknown module {module!r}")
                continue
            got[module].add(suffix)
        packed = set(PACKED_SUFFIXES)
        for module, suffixes in got.items():
            ckpt = self._modules[module]
            quantized = module_is_quantized(spec, self.num_layers, module)
            if suffixes & packed and not quantized:
                errors.append(
                    f"{module}: packed NVFP4 tensors sent, but recipe {self.recipe.name!r}'s sampler runs "
                    "this module unquantized; send .weight"
                )
                continue
            if quantized and suffixes & packed:
                if "weight" in suffixes:
                    errors.append(f"{module}: send either .weight or the packed triple, not both")
                elif not packed <= suffixes:
                    errors.append(f"{module}: incomplete packed triple, missing {sorted(packed - suffixes)}")
                suffixes = (suffixes - packed) | {"weight"}
            if suffixes != ckpt:
                errors.append(f"{module}: got {sorted(suffixes)}, the checkpoint has {sorted(ckpt)}")
        groups: dict[str, set[str]] = defaultdict(set)
        for module in self._modules:
            groups[fused_group(module)].add(module)
        for group in {fused_group(m) for m in got}:
            missing = groups[group] - set(got)
            if missing:
                errors.append(
                    f"{group}: vLLM reloads it as one layer; the update lacks {len(missing)} of its "
                    f"modules, e.g. {sorted(missing)[:3]}"
                )
        if errors:
            raise ValueError("WeightUpdate rejected:\n  " + "\n  ".join(errors))

    def update_weights(self, update: WeightUpdate) -> None:
        self.check_update(update)
        weights = [(n, t.detach().to("cpu").contiguous()) for n, t in update.tensors.items()]
        self.llm.apply_model(lambda model: _cpu_moe_reload(model, "prepare"))
        try:
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True}
            )
        finally:
            self.llm.apply_model(lambda model: _cpu_moe_reload(model, "finish"))
        self.llm.reset_prefix_cache()
        self.version = update.version

    def close(self) -> None:
        """Shut the engine down and release vLLM's process-global state, so another engine can start
        in this process."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        with contextlib.suppress(Exception):  # best effort; the engine may already be down
            llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        from vllm.distributed import parallel_state
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

        destroy_model_parallel()
        if self.external_launcher:
            # vLLM's world group is a group of its own over the learner's ranks: drop it, but keep the
            # default process group (destroy_distributed_environment would destroy it under the learner)
            if parallel_state._WORLD is not None:
                parallel_state._WORLD.destroy()
            parallel_state._WORLD = None
            parallel_state._NODE_COUNT = None
        else:
            destroy_distributed_environment()

    def __enter__(self) -> VLLMSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
