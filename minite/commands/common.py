"""Shared CLI plumbing: profile loading, `--set key=value` overrides, friendly errors."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from minite.configuration import ConfigError, deep_merge, load_yaml


def parse_set(items: list[str] | None) -> dict[str, Any]:
    """["a.b=1", "c=x"] -> {"a": {"b": 1}, "c": "x"} (values parsed as YAML scalars)."""
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, raw = item.split("=", 1)
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = yaml.safe_load(raw)
    return out


def load_profile(path: str | Path, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    data = load_yaml(path)
    return deep_merge(data, overrides or {})


def run_guarded(fn: Callable[[], int | None]) -> int:
    """Turn expected user errors into one clear line on stderr and exit code 2 (no traceback): a bad
    config value or input file (ConfigError), a missing file, a corrupted checkpoint."""
    try:
        return int(fn() or 0)
    except Exception as e:
        if not isinstance(e, _user_errors()):
            raise
        print(f"minite: error: {e}", file=sys.stderr)
        return 2


def _user_errors() -> tuple[type[Exception], ...]:
    # minite.checkpoint imports torch: look it up only if loaded (a verb that never loaded it cannot
    # have raised its CheckpointError), so light verbs (resolve, log) stay torch-free
    ckpt = sys.modules.get("minite.checkpoint")
    return (ConfigError, FileNotFoundError) + ((ckpt.CheckpointError,) if ckpt else ())


def add_set_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config value (repeatable)")
