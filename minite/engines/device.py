"""Where the engines run: the `device` setting of a train config (`rl.device`) and of SFT
(`prepare.sft.device`), resolved to a torch device.

    auto     cuda (the current CUDA device) when torch sees a GPU, else cpu
    cpu      the CPU (the tiny reproduction's numbers, bit for bit)
    cuda     the current CUDA device (`torch.cuda.current_device()`: under torchrun, the rank's own)
    cuda:N   CUDA device N

`check_device` validates the spelling (config load time, no torch query); `resolve_device` asks torch
and raises `ConfigError` when CUDA is asked for and absent, before any model is built.
"""

from __future__ import annotations

import re

import torch

from minite.configuration import ConfigError

DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:[0-9]+)?)$")
DEVICE_CHOICES = "'auto', 'cpu', 'cuda' or 'cuda:N'"


def check_device(spec: str, key: str = "device") -> None:
    """ConfigError unless `spec` is one of the spellings above."""
    if not isinstance(spec, str) or not DEVICE_PATTERN.match(spec):
        raise ConfigError(f"{key} must be {DEVICE_CHOICES}, got {spec!r}")


def resolve_device(spec: str, key: str = "device") -> torch.device:
    """The torch device `spec` names on this machine (module docstring)."""
    check_device(spec, key)
    if spec == "cpu":
        return torch.device("cpu")
    available = torch.cuda.is_available()
    if spec == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if available else torch.device("cpu")
    if not available:
        why = "this torch is a CPU-only build" if torch.version.cuda is None else "torch sees no GPU"
        raise ConfigError(
            f"{key}={spec!r}: CUDA is not available ({why}, torch {torch.__version__}); set {key} to "
            "'auto' or 'cpu', or run on a machine with a GPU"
        )
    index = torch.cuda.current_device() if spec == "cuda" else int(spec.split(":")[1])
    count = torch.cuda.device_count()
    if index >= count:
        raise ConfigError(
            f"{key}={spec!r}: there are {count} CUDA device(s) (0..{count - 1}); pick one of them or 'cuda'"
        )
    return torch.device("cuda", index)
