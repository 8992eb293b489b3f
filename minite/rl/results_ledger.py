"""The results ledger: one compact record per finished RL run, so that seeds accumulate run after run and
machine after machine, and `minite claims` pools every seed that measured the same thing.

A record (`ledger_record(run_dir)`, one JSON of at most `MAX_RECORD_BYTES`) holds what the claims read
from a run folder results/<profile>/rl/<arm>/seed<S>: the per-step metrics (columns, one value per
step), the in-loop evals (eval/accuracy is one of the columns; eval_initial.json beside them), the
final lm-eval JSON when one exists (results/<profile>/eval/<arm>/seed<S>.json), summary.json, the
non-finite events, the run's settings (config.json without its paths) and resolved recipe, and where it
came from: the code commit, the machine, the sampler engine and the device kind (cpu or gpu).

Which records pool: the `hash` names what was measured,

    hash = sha256(json({"rl": config.json - INSTANCE_KEYS, "recipe": the resolved recipe - description,
                        "numerics_version": NUMERICS_VERSION}))[:16]

INSTANCE_KEYS (paths, the seed, the checkpoint interval, the rank count) say where and which instance
ran, not what it measured: resume equals an uninterrupted run (tests/rl/test_loop.py), and seeds are
what pooling adds up. NUMERICS_VERSION is bumped by hand in any change to the code that moves a
number a recipe computes (a kernel, a quantizer, the loop's arithmetic): records of the older numerics
then stop pooling. The arm's current hash comes from the resolved run the workflow writes
(results/<profile>/runs/<arm>/train.yaml + recipe.yaml, `current_hash`); `pool` takes every record of
the arm whose hash equals it and refuses one with another hash (naming both), and refuses a profile
whose records mix CPU and GPU runs.

Size. Per-step columns keep full precision for the keys the claims read (`CLAIMS_KEYS`) and 6
significant digits elsewhere (0 stays 0, a positive gap stays positive); if the record is still over the
budget, columns go one by one in `DROP_ORDER` (timings first) and are listed under `dropped_columns`,
then the gap by position and length (`BINNED_PREFIXES`), never the claims' keys (`_fit`).

Layout: results/ledger/<profile>/<arm>/seed<S>.json (`minite ledger add <run_dir>... --into
results/ledger`); the RL loop writes <out_dir>/ledger.json at the end of every run
(`write_ledger_record`).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import platform
import re
from pathlib import Path
from typing import Any

from minite.configuration import ConfigError

NUMERICS_VERSION = 1
SCHEMA = 1
MAX_RECORD_BYTES = 200 * 1024
LEDGER_FILE = "ledger.json"
INITIAL_EVAL_FILE = "eval_initial.json"  # minite.rl.loop.INITIAL_EVAL_FILE

# config.json keys that say which instance ran, not what it measured (module docstring)
INSTANCE_KEYS = ("model_dir", "data_dir", "out_dir", "recipe", "seed", "checkpoint_every", "world_size")
# per-step keys the claims read: never rounded, never dropped
CLAIMS_KEYS = (
    "reward_mean",
    "eval/accuracy",
    "mismatch/logp_abs_diff_mean",
    "mismatch/logp_abs_diff_max",
    "mismatch/kl_k3",
    "skipped",
)
# the gap by response position and length (minite.diagnostics.metrics): rounded, never dropped
BINNED_PREFIXES = ("mismatch/gap_by_", "mismatch/tokens_by_")
# columns dropped, in this order, when a record is over MAX_RECORD_BYTES ("" last: any other column)
DROP_ORDER = ("time/", "rollout/", "train/", "reward/", "mismatch/ratio_", "mismatch/seq_", "mismatch/", "")

REQUIRED = (
    "schema",
    "profile",
    "arm",
    "seed",
    "hash",
    "numerics_version",
    "commit",
    "machine",
    "device_kind",
    "engine",
    "config",
    "recipe",
    "metrics",
    "summary",
    "events",
    "eval_initial",
    "evals",
    "created",
)


class LedgerError(ConfigError):
    """A ledger record that cannot be used: a missing field, another hash, mixed device kinds."""


# --- the hash -------------------------------------------------------------------------------------------


def rl_settings(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in INSTANCE_KEYS}


def recipe_numerics(recipe: dict[str, Any]) -> dict[str, Any]:
    """The recipe as its resolved mapping (every default filled in), without its description."""
    from minite.recipes import recipe_from_dict

    return {k: v for k, v in recipe_from_dict(dict(recipe)).to_dict().items() if k != "description"}


def config_hash(
    config: dict[str, Any], recipe: dict[str, Any], numerics_version: int = NUMERICS_VERSION
) -> str:
    payload = {
        "rl": rl_settings(config),
        "recipe": recipe_numerics(recipe),
        "numerics_version": numerics_version,
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def current_hash(run_spec_dir: str | Path) -> str:
    """The hash an arm's runs have now: from the workflow's resolved run (results/<profile>/runs/<arm>/
    train.yaml + recipe.yaml), what `minite train` would write to config.json."""
    from minite.configuration import load_yaml, to_dict
    from minite.rl.config import load_train_config

    d = Path(run_spec_dir)
    for name in ("train.yaml", "recipe.yaml"):
        if not (d / name).is_file():
            raise FileNotFoundError(
                f"{d / name}: the arm's resolved run is missing (run the rule run_config)"
            )
    cfg = load_train_config(d / "train.yaml", {"model_dir": "-", "data_dir": "-", "out_dir": "-"})
    return config_hash(json.loads(json.dumps(to_dict(cfg), default=str)), load_yaml(d / "recipe.yaml"))


def spec_hash(spec: dict[str, Any]) -> str:
    """`current_hash` from a run spec (minite.profiles.resolve_run: its recipe_mapping and rl
    settings) instead of the files `minite resolve` writes from it: the workflow asks this while it
    plans, before any file exists."""
    from minite.configuration import from_dict, to_dict
    from minite.recipes import recipe_from_dict
    from minite.rl.config import TrainConfig

    recipe = recipe_from_dict(dict(spec["recipe_mapping"]), where=f"recipe of run {spec['run']}")
    cfg = from_dict(TrainConfig, {**spec["rl"], "model_dir": "-", "data_dir": "-", "out_dir": "-"})
    return config_hash(json.loads(json.dumps(to_dict(cfg), default=str)), recipe.to_dict())


# --- building a record ----------------------------------------------------------------------------------


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def _short(v: Any) -> Any:
    if isinstance(v, float) and math.isfinite(v) and v != 0:
        return float(f"{v:.6g}")
    return v


def _keep_full(key: str) -> bool:
    return key in CLAIMS_KEYS


def _kept(key: str) -> bool:
    return key in CLAIMS_KEYS or key.startswith(BINNED_PREFIXES)


def columns(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """metrics.jsonl as {"step": [...], "columns": {key: [value or None per step]}}."""
    keys = sorted({k for r in rows for k in r if k != "step"})
    cols = {
        k: [(r.get(k) if _keep_full(k) else _short(r.get(k))) if k in r else None for r in rows] for k in keys
    }
    return {"step": [r.get("step") for r in rows], "columns": cols}


def rows_of(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-step rows back from `columns` (keys absent at a step stay absent)."""
    out = []
    for i, step in enumerate(metrics["step"]):
        row = {"step": step}
        row.update({k: v[i] for k, v in metrics["columns"].items() if v[i] is not None})
        out.append(row)
    return out


def _layout(run_dir: Path) -> tuple[str, str, int | None]:
    """(profile, arm, seed) from results/<profile>/rl/<arm>/seed<S>; "unknown" where it does not fit."""
    m = re.fullmatch(r"seed(\d+)", run_dir.name)
    if m and run_dir.parent.parent.name == "rl":
        return run_dir.parents[2].name, run_dir.parent.name, int(m.group(1))
    return "unknown", run_dir.parent.name if m else run_dir.name, int(m.group(1)) if m else None


def _recipe_mapping(cfg: dict[str, Any], run_dir: Path, arm: str) -> dict[str, Any]:
    from minite.configuration import load_yaml
    from minite.recipes import get_recipe

    ref = str(cfg.get("recipe", ""))
    spec = run_dir.parents[2] / "runs" / arm / "recipe.yaml" if len(run_dir.parents) > 2 else None
    for cand in (Path(ref), spec):
        if cand is not None and cand.suffix in (".yaml", ".yml") and cand.is_file():
            return load_yaml(cand)
    return get_recipe(ref).to_dict()


def machine() -> dict[str, Any]:
    import os

    out: dict[str, Any] = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
    }
    try:
        import torch

        if torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return out


def device_kind(cfg: dict[str, Any], run_dir: Path) -> str:
    """ "gpu" when the run's trainer ran on CUDA (its config says so, or memory.json has a CUDA peak)."""
    if str(cfg.get("device", "")).startswith("cuda"):
        return "gpu"
    mem = _read_json(run_dir / "memory.json") or []
    return "gpu" if any("cuda_peak_mib" in r for r in mem if isinstance(r, dict)) else "cpu"


def ledger_record(
    run_dir: str | Path,
    *,
    eval_file: str | Path | None = None,
    profile: str | None = None,
    arm: str | None = None,
    commit: str | None = None,
) -> dict[str, Any]:
    """The record of one finished RL run (module docstring). `profile` / `arm` default to the folder's
    place in results/<profile>/rl/<arm>/seed<S>; `eval_file` to results/<profile>/eval/<arm>/seed<S>.json
    when it exists; `commit` and the machine to those of <run_dir>/ledger.json when the loop wrote one
    at the end of the run, else to the checkout's HEAD (minite.tracking.git_commit) and this machine."""
    d = Path(run_dir)
    for name in ("metrics.jsonl", "config.json", "summary.json"):
        if not (d / name).is_file():
            raise FileNotFoundError(f"{d / name}: not a finished RL run (no {name})")
    cfg = json.loads((d / "config.json").read_text())
    p, a, _ = _layout(d)
    profile, arm = profile or p, arm or a
    seed = int(cfg.get("seed", 0))
    if eval_file is None and p != "unknown":
        cand = d.parents[2] / "eval" / a / f"seed{seed}.json"
        eval_file = cand if cand.is_file() else None
    # the record the loop wrote when the run finished knows the commit and machine that ran it
    at_finish = _read_json(d / LEDGER_FILE) or {}
    commit = commit or at_finish.get("commit")
    if commit is None:
        from minite.tracking import git_commit

        commit = git_commit()
    recipe = _recipe_mapping(cfg, d, a)
    record: dict[str, Any] = {
        "schema": SCHEMA,
        "profile": profile,
        "arm": arm,
        "seed": seed,
        "hash": config_hash(cfg, recipe),
        "numerics_version": NUMERICS_VERSION,
        "commit": commit,
        "machine": at_finish.get("machine") or machine(),
        "device_kind": device_kind(cfg, d),
        "engine": (cfg.get("sampler") or {}).get("engine", "builtin"),
        "config": rl_settings(cfg),
        "recipe": recipe,
        "metrics": columns(_jsonl(d / "metrics.jsonl")),
        "summary": json.loads((d / "summary.json").read_text()),
        "events": _jsonl(d / "events.jsonl"),
        "eval_initial": _read_json(d / INITIAL_EVAL_FILE),
        "evals": _read_json(Path(eval_file)) if eval_file else None,
        "created": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    _fit(record)
    validate_record(record, str(d))
    return record


def record_bytes(record: dict[str, Any]) -> int:
    return len(json.dumps(record, separators=(",", ":")).encode())


def _fit(record: dict[str, Any]) -> None:
    """Make a long run's record fit MAX_RECORD_BYTES, in stages that lose the least first: drop the
    non-claims columns one by one (DROP_ORDER), then the gap-by-position/length columns, then round the
    claims' keys to 9 significant digits (0 stays 0 and a positive gap positive, so zero_gap and
    gap_positive hold; `claims_keys_rounded` says so). A record still over the budget (thousands of
    steps) is refused by `validate_record`."""
    cols = record["metrics"]["columns"]
    dropped: list[str] = []
    order = [k for prefix in DROP_ORDER for k in sorted(cols) if k.startswith(prefix) and not _kept(k)]
    order += [
        k
        for prefix in ("mismatch/tokens_by_", "mismatch/gap_by_")
        for k in sorted(cols)
        if k.startswith(prefix)
    ]
    for k in dict.fromkeys(order):  # a key matched by two prefixes is dropped once
        if record_bytes(record) <= MAX_RECORD_BYTES:
            break
        dropped.append(k)
        del cols[k]
    if dropped:
        record["metrics"]["dropped_columns"] = dropped
    if record_bytes(record) > MAX_RECORD_BYTES:
        for k in CLAIMS_KEYS:
            if k in cols:
                cols[k] = [
                    float(f"{v:.9g}") if isinstance(v, float) and math.isfinite(v) else v for v in cols[k]
                ]
        record["metrics"]["claims_keys_rounded"] = True


def validate_record(record: Any, where: str = "ledger record") -> dict[str, Any]:
    """Refuse a record that cannot be pooled: not a mapping, a missing field (named), a metrics table
    of the wrong shape, or over MAX_RECORD_BYTES."""
    if not isinstance(record, dict):
        raise LedgerError(f"{where}: a ledger record is a JSON object, got {type(record).__name__}")
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        raise LedgerError(
            f"{where}: missing field {missing[0]!r}"
            + (f" (and {', '.join(map(repr, missing[1:]))})" if missing[1:] else "")
            + "; rebuild it from the run folder with `minite ledger add <run_dir> --into results/ledger`"
        )
    m = record["metrics"]
    if not (isinstance(m, dict) and isinstance(m.get("step"), list) and isinstance(m.get("columns"), dict)):
        raise LedgerError(f"{where}: field 'metrics' must be {{'step': [...], 'columns': {{...}}}}")
    bad = [k for k, v in m["columns"].items() if not isinstance(v, list) or len(v) != len(m["step"])]
    if bad:
        raise LedgerError(f"{where}: metrics column {bad[0]!r} does not have one value per step")
    if record["device_kind"] not in ("cpu", "gpu"):
        raise LedgerError(
            f"{where}: field 'device_kind' must be 'cpu' or 'gpu', got {record['device_kind']!r}"
        )
    size = record_bytes(record)
    if size > MAX_RECORD_BYTES:
        raise LedgerError(f"{where}: {size:,} bytes, over the {MAX_RECORD_BYTES:,}-byte budget of a record")
    return record


# --- writing and pooling --------------------------------------------------------------------------------


def write_json(record: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, separators=(",", ":")) + "\n")
    tmp.replace(path)  # atomic: a reader never sees half a record
    return path


def write_ledger_record(out_dir: str | Path, commit: str | None = None) -> Path:
    """<out_dir>/ledger.json: the record of the run that just finished in `out_dir` (the RL loop calls
    this at the end of every run, with the commit it started at; `minite ledger add` files it under
    results/ledger later)."""
    d = Path(out_dir)
    return write_json(ledger_record(d, commit=commit), d / LEDGER_FILE)


def ledger_path(root: str | Path, record: dict[str, Any]) -> Path:
    return Path(root) / record["profile"] / record["arm"] / f"seed{record['seed']}.json"


def add(run_dirs: list[str | Path], into: str | Path, **kw: Any) -> list[Path]:
    """File the record of every run folder under <into>/<profile>/<arm>/seed<S>.json (all records are
    built and validated before any is written)."""
    records = [ledger_record(d, **kw) for d in run_dirs]
    unknown = [str(d) for d, r in zip(run_dirs, records, strict=True) if r["profile"] == "unknown"]
    if unknown:
        raise LedgerError(
            f"{unknown[0]}: not under results/<profile>/rl/<arm>/seed<S>; give --profile (and --arm)"
        )
    return [write_json(r, ledger_path(into, r)) for r in records]


def load_record(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        rec = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise LedgerError(f"{p}: not JSON ({e.msg})") from e
    return validate_record(rec, str(p))


def arm_records(root: str | Path, profile: str, arm: str) -> list[tuple[Path, dict[str, Any]]]:
    files = sorted(Path(root, profile, arm).glob("seed*.json"), key=lambda p: int(p.stem[4:] or 0))
    return [(f, load_record(f)) for f in files]


def holds(root: str | Path, profile: str, arm: str, seed: int, hash_: str) -> bool:
    """Does the ledger hold a valid record of (arm, seed) with this hash (the workflow can skip it)?"""
    f = Path(root, profile, arm, f"seed{seed}.json")
    if not f.is_file():
        return False
    try:
        rec = load_record(f)
    except LedgerError:
        return False
    return rec["hash"] == hash_ and rec["seed"] == seed


def pool(root: str | Path, profile: str, current: dict[str, str]) -> list[dict[str, Any]]:
    """Every record of `profile` for the arms in `current` ({arm: its current hash}). Refuses a record
    whose hash is another, whose profile/arm/seed disagree with its place, and a profile whose records
    mix CPU and GPU runs (their numerics and speeds differ: never one population)."""
    out: list[dict[str, Any]] = []
    for arm, want in current.items():
        for f, rec in arm_records(root, profile, arm):
            where = (rec["profile"], rec["arm"], f"seed{rec['seed']}")
            if where != (profile, arm, f.stem):
                raise LedgerError(
                    f"{f}: the record is of {'/'.join(where)}, filed under {profile}/{arm}/{f.stem}"
                )
            if rec["hash"] != want:
                raise LedgerError(
                    f"{f}: hash {rec['hash']} (numerics version {rec['numerics_version']}, commit "
                    f"{rec['commit']}) is not the arm's current {want}: its settings, recipe or numerics "
                    "differ from what this profile runs now; rerun that seed or move the record out of the "
                    "ledger"
                )
            out.append(rec)
    kinds = sorted({r["device_kind"] for r in out})
    if len(kinds) > 1:
        by = {k: sorted({f"{r['arm']}/seed{r['seed']}" for r in out if r["device_kind"] == k}) for k in kinds}
        raise LedgerError(
            f"ledger {Path(root) / profile}: records of CPU and GPU runs ({by}) in one profile; a CPU "
            "and a GPU profile are never pooled: file them under different profiles"
        )
    return out


def provenance(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """How many seeds of each arm came from which commit and machine (for the claims report)."""
    groups: dict[tuple, list[int]] = {}
    for r in records:
        m = r["machine"]
        where = m.get("gpu") or m.get("processor") or "?"
        key = (r["arm"], r["commit"], m.get("hostname", "?"), where, r["device_kind"], r["engine"])
        groups.setdefault(key, []).append(r["seed"])
    return [
        {
            "arm": k[0],
            "commit": k[1],
            "machine": k[2],
            "hardware": k[3],
            "device_kind": k[4],
            "engine": k[5],
            "seeds": sorted(v),
        }
        for k, v in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2]))
    ]
