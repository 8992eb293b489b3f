"""`minite plan`: check a profile's model at full size without GPUs.

Builds Qwen3-30B-A3B on the meta device (no memory), applies each recipe's trainer and sampler numerics
with the module swap the engines use, and prints the parameter count, the NVFP4/BF16 split per recipe
and engine, and the FSDP2 learner's memory per GPU (minite/distributed/memory_plan.py states every
assumption). Exit code 1 when a count disagrees with its closed form, or with --require-fit when the
plan does not fit.

    minite plan --profile configs/paper.yaml
    minite plan --profile paper --gpus 16 --micro-batch 2 --json plan.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from minite.commands.common import run_guarded


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="minite plan", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--profile", default="paper", help="profile name or configs/<name>.yaml (default paper)")
    p.add_argument("--gpus", type=int, help="GPUs of the learner (default: the profile's jobs.rl.gpus)")
    p.add_argument("--micro-batch", type=int, help="sequences per micro-batch (default: rl.micro_batch)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default: rl.sampler.max_model_len)")
    p.add_argument("--gpu-gib", type=float, help="memory budget per GPU in GiB (default 140, an H200)")
    p.add_argument(
        "--no-activation-checkpointing", action="store_true", help="plan without per-layer checkpointing"
    )
    p.add_argument("--json", type=Path, help="also write the report as JSON here")
    p.add_argument("--require-fit", action="store_true", help="exit 1 if a recipe's plan does not fit")
    args = p.parse_args(argv)

    def go() -> int:
        from minite.distributed.memory_plan import plan_profile, render, settings_from_profile
        from minite.profiles import load_profile

        profile = load_profile(args.profile)
        settings = settings_from_profile(
            profile,
            gpus=args.gpus,
            micro_batch=args.micro_batch,
            seq_len=args.seq_len,
            gpu_gib=args.gpu_gib,
            activation_checkpointing=False if args.no_activation_checkpointing else None,
        )
        report = plan_profile(profile, settings)
        print(render(report), end="")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=2, sort_keys=True))
        params = report["params"]
        bad = params["built_on_meta"] != params["total"]
        for name, e in report["recipes"].items():
            for engine in ("trainer", "sampler"):
                if e[engine]["nvfp4"] != e[engine]["expected_nvfp4"]:
                    print(f"minite plan: {name} {engine}: NVFP4 split differs from the recipe's layer set")
                    bad = True
            bad = bad or (args.require_fit and not e["fits"])
        return 1 if bad else 0

    return run_guarded(go)
