"""Workflow profiles: what one `snakemake --config profile=<name>` run does, as data.

A profile is `configs/<name>.yaml`. It is composed in layers, later layers winning key by key:

    configs/<base>.yaml        (when the profile says `extends: <base>`, recursively)
    configs/<name>.yaml
    snakemake --configfile / --config overrides   (e.g. --config seeds=[0,1] rl='{steps: 4}')

and the result is validated against `configs/profile.schema.yaml` before Snakemake plans anything. A
violation is reported with the dotted key, the layer that set it (the file to edit, or `--config`),
and the closest valid key or value, so a typo costs seconds.

Runs. A profile runs its `recipes` (configs/recipes/<name>.yaml) and its `ablations`
(configs/ablations/<name>.yaml). Both share one namespace, the *run name*, which names the output
folders (results/<profile>/rl/<run>/seed<S>/) and the MLflow runs. An ablation file holds
    recipe: {extends: <recipe>, <fields to override>}    the recipe, named after the file
    rl:     {<overrides of the profile's rl section>}     optional, e.g. {grpo: {tis: true}}
`resolve_run` turns a run name into its full recipe mapping and its full rl settings, and lists the
YAML files they came from (the inputs of the workflow's `run_config` rule, so editing one of them
reruns exactly the runs that depend on it).

Nothing here imports torch: the Snakefile calls it on every invocation, and `snakemake -n` must stay
fast. Recipe *values* are checked by `minite.recipes` when the `run_config` job resolves them.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from minite.configuration import ConfigError, deep_merge, load_yaml

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
PROFILE_SCHEMA = CONFIGS / "profile.schema.yaml"
ABLATION_SCHEMA = CONFIGS / "ablation.schema.yaml"
DEFAULT_PROFILE = "tiny"

_SEP = "."


# --- loading ------------------------------------------------------------------------------------------


def profile_path(name_or_path: str | Path, configs_dir: Path = CONFIGS) -> Path:
    """configs/<name>.yaml for a bare name; a path (with a '/' or a .yaml suffix) as given."""
    s = str(name_or_path)
    if s.endswith((".yaml", ".yml")) or "/" in s:
        return Path(s)
    return configs_dir / f"{s}.yaml"


def _available_profiles(configs_dir: Path) -> list[str]:
    return sorted(p.stem for p in configs_dir.glob("*.yaml") if not p.name.endswith(".schema.yaml"))


def load_layers(name_or_path: str | Path, configs_dir: Path = CONFIGS) -> list[tuple[str, dict[str, Any]]]:
    """[(source label, mapping)] from the root of the `extends` chain down to the profile itself."""
    layers: list[tuple[str, dict[str, Any]]] = []
    seen: list[str] = []
    current: str | Path | None = name_or_path
    while current is not None:
        path = profile_path(current, configs_dir)
        if not path.is_file():
            avail = _available_profiles(configs_dir)
            hint = difflib.get_close_matches(Path(str(current)).stem, avail, n=1)
            did = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ConfigError(
                f"profile {str(current)!r}: no file {path}{did}; available profiles: {', '.join(avail)}"
            )
        if str(path.resolve()) in seen:
            raise ConfigError(f"profile {name_or_path}: `extends` cycle through {path}")
        seen.append(str(path.resolve()))
        data = load_yaml(path)
        layers.insert(0, (_rel(path), data))
        current = data.get("extends")
    return layers


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def load_profile(
    name_or_path: str | Path = DEFAULT_PROFILE,
    overrides: dict[str, Any] | None = None,
    *,
    configs_dir: Path = CONFIGS,
    validate: bool = True,
) -> dict[str, Any]:
    """The merged, validated profile (see the module docstring); `overrides` are --config values."""
    layers = load_layers(name_or_path, configs_dir)
    overrides = coerce_cli({k: v for k, v in (overrides or {}).items() if k != "profile"})
    if overrides:
        layers.append(("--config", overrides))
    cfg: dict[str, Any] = {}
    for _, data in layers:
        cfg = deep_merge(cfg, data)
    cfg.pop("extends", None)
    # the profile's name is the one asked for, not the one of a file it extends
    cfg["profile"] = Path(str(name_or_path)).stem
    if validate:
        validate_profile(cfg, layers=layers, configs_dir=configs_dir)
    return cfg


def _scalar(s: str) -> Any:
    """ "2" -> 2, "1e-4" -> 0.0001, "true" -> True, "null" -> None; other strings unchanged."""
    import yaml

    try:
        v = yaml.safe_load(s)
    except yaml.YAMLError:
        return s
    if isinstance(v, bool | int | float) or v is None:
        return v
    try:
        return float(s)
    except ValueError:
        return s


def coerce_cli(value: Any) -> Any:
    """Type the leaves of `snakemake --config` values. Snakemake parses nested values with YAML's
    BaseLoader, so `--config seeds=[0,1] rl='{steps: 4}'` arrives as ["0", "1"] and {"steps": "4"}."""
    if isinstance(value, dict):
        return {k: coerce_cli(v) for k, v in value.items()}
    if isinstance(value, list):
        return [coerce_cli(v) for v in value]
    if isinstance(value, str):
        return _scalar(value)
    return value


# --- validation -------------------------------------------------------------------------------------


def _schema(path: Path) -> dict[str, Any]:
    return load_yaml(path)


def _origin(layers: list[tuple[str, dict[str, Any]]] | None, path: list[Any]) -> str:
    """The last layer that sets `path` (where the user should edit)."""
    if not layers:
        return "the config"
    for label, data in reversed(layers):
        node: Any = data
        ok = True
        for p in path:
            in_dict = isinstance(node, dict) and p in node
            in_list = isinstance(node, list) and isinstance(p, int) and p < len(node)
            if in_dict or in_list:
                node = node[p]
            else:
                ok = False
                break
        if ok and path:
            return label
    return layers[-1][0]


def key_source(
    name_or_path: str | Path,
    path: list[Any],
    overrides: dict[str, Any] | None = None,
    configs_dir: Path = CONFIGS,
) -> str:
    """Where the key `path` (e.g. ["jobs", "rl", "mem_mb"]) of a profile is set: "--config" when the
    command-line `overrides` set it, else the last profile file of the `extends` chain that does
    ("--config" too when none does)."""
    candidates = [("--config", overrides or {}), *reversed(load_layers(name_or_path, configs_dir))]
    for label, data in candidates:
        node: Any = data
        for p in path:
            node = node.get(p) if isinstance(node, dict) else None
        if node is not None:
            return label
    return "--config"


def _dotted(path: Iterable[Any]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (_SEP if out else "") + str(p)
    return out or "(top level)"


def _explain(err, layers) -> str:
    """One actionable line for a jsonschema ValidationError."""
    from jsonschema.exceptions import best_match

    if err.validator in ("oneOf", "anyOf") and err.context:
        # explain the branch meant for this kind of value (a mapping's errors, not "expected string")
        specific = [e for e in err.context if e.validator != "type"]
        err = best_match(specific or err.context)
    path = list(err.absolute_path)
    where = _dotted(path)
    v, inst, schema = err.validator, err.instance, err.schema
    if v == "additionalProperties" and isinstance(inst, dict):
        valid = sorted(schema.get("properties", {}))
        bad = [k for k in inst if k not in valid]
        msgs = []
        for k in bad:
            close = difflib.get_close_matches(str(k), valid, n=1)
            did = f" (did you mean {close[0]!r}?)" if close else ""
            full = _dotted([*path, k])
            msgs.append(
                f"{full}: unknown key {k!r}{did}, set in {_origin(layers, [*path, k])}; "
                f"valid keys under {where}: {', '.join(valid)}"
            )
        return "\n".join(msgs)
    src = _origin(layers, path)
    if v == "enum":
        opts = [o for o in err.validator_value]
        close = difflib.get_close_matches(str(inst), [str(o) for o in opts], n=1)
        did = f" (did you mean {close[0]!r}?)" if close else ""
        return f"{where}: {inst!r} is not one of {opts}{did}; set in {src}"
    if v == "type":
        want = err.validator_value
        hint = ""
        if "array" in (want if isinstance(want, list) else [want]):
            hint = " (on the command line write a list as --config 'key=[a,b]')"
        if "object" in (want if isinstance(want, list) else [want]):
            hint = ' (on the command line write a mapping as --config "key={a: 1}")'
        return f"{where}: expected {want}, got {type(inst).__name__} {inst!r}{hint}; set in {src}"
    if v == "required":
        missing = [k for k in err.validator_value if not isinstance(inst, dict) or k not in inst]
        return f"{where}: missing required key(s) {missing}; add them in {src}"
    if v in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        return f"{where}: {inst!r} violates {v} {err.validator_value}; set in {src}"
    if v == "pattern":
        return f"{where}: {inst!r} must be a plain name (letters, digits, _ and -); set in {src}"
    if v == "uniqueItems":
        return f"{where}: {inst!r} lists an entry twice; set in {src}"
    if v in ("minItems", "maxItems"):
        return f"{where}: {inst!r} needs {v} {err.validator_value}; set in {src}"
    if v == "not":
        return f"{where}: this key is not allowed here; remove it from {src}"
    return f"{where}: {err.message}; set in {src}"


def schema_errors(
    data: dict[str, Any], schema: dict[str, Any], layers: list[tuple[str, dict[str, Any]]] | None = None
) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: (list(map(str, e.absolute_path)), e.validator))
    return list(dict.fromkeys(_explain(e, layers) for e in errors))


def validate_profile(
    cfg: dict[str, Any],
    *,
    layers: list[tuple[str, dict[str, Any]]] | None = None,
    configs_dir: Path = CONFIGS,
    schema_path: Path = PROFILE_SCHEMA,
) -> None:
    """Raise ConfigError listing every problem (schema, then cross-references to recipe/ablation files)."""
    msgs = schema_errors(cfg, _schema(schema_path), layers)
    if not msgs:
        msgs = _cross_check(cfg, layers, configs_dir)
    if msgs:
        name = cfg.get("profile", "?")
        raise ConfigError(
            f"invalid workflow config (profile {name!r}):\n  "
            + "\n  ".join(m.replace("\n", "\n  ") for m in msgs)
        )


def recipes_dir(cfg: dict[str, Any]) -> Path:
    return _dir(cfg, "recipes")


def ablations_dir(cfg: dict[str, Any]) -> Path:
    return _dir(cfg, "ablations")


def _dir(cfg: dict[str, Any], key: str) -> Path:
    p = Path((cfg.get("paths") or {}).get(key) or CONFIGS / key)
    return p if p.is_absolute() else REPO / p


def _names(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.yaml"))


def _unknown(kind: str, name: str, folder: Path, where: str) -> str:
    avail = _names(folder)
    close = difflib.get_close_matches(name, avail, n=1)
    did = f" (did you mean {close[0]!r}?)" if close else ""
    missing = _rel(folder / f"{name}.yaml")
    return f"{where}: unknown {kind} {name!r}{did}: no {missing}; available: {', '.join(avail)}"


def _cross_check(cfg, layers, configs_dir) -> list[str]:
    msgs: list[str] = []
    rdir, adir = recipes_dir(cfg), ablations_dir(cfg)
    for i, r in enumerate(cfg["recipes"]):
        if not (rdir / f"{r}.yaml").is_file():
            msgs.append(_unknown("recipe", r, rdir, f"recipes[{i}] (set in {_origin(layers, ['recipes'])})"))
    for r in (cfg.get("throughput") or {}).get("recipes") or []:
        if not (rdir / f"{r}.yaml").is_file():
            msgs.append(
                _unknown("recipe", r, rdir, f"throughput.recipes (set in {_origin(layers, ['throughput'])})")
            )
    runs = set(cfg["recipes"]) | set(cfg.get("ablations") or [])
    for name in cfg.get("run_overrides") or {}:
        # a run this profile could have but does not select (`ablations` narrowed by an overlay or
        # --config) keeps its override unused; only a name that is no run at all is a typo
        known = (rdir / f"{name}.yaml").is_file() or (adir / f"{name}.yaml").is_file()
        if name not in runs and not known:
            close = difflib.get_close_matches(name, sorted(runs), n=1)
            did = f" (did you mean {close[0]!r}?)" if close else ""
            msgs.append(
                f"run_overrides.{name}: not a run of this profile{did}, set in "
                f"{_origin(layers, ['run_overrides', name])}; runs: {', '.join(sorted(runs))}"
            )
    for i, a in enumerate(cfg.get("ablations") or []):
        where = f"ablations[{i}] (set in {_origin(layers, ['ablations'])})"
        if a in cfg["recipes"] or (rdir / f"{a}.yaml").is_file():
            msgs.append(f"{where}: {a!r} is a recipe name; an ablation needs a name of its own")
            continue
        if not (adir / f"{a}.yaml").is_file():
            msgs.append(_unknown("ablation", a, adir, where))
            continue
        try:
            load_ablation(a, cfg)
        except ConfigError as e:
            msgs.append(str(e))
    return msgs


# --- runs -------------------------------------------------------------------------------------------


def load_ablation(name: str, cfg: dict[str, Any]) -> dict[str, Any]:
    path = ablations_dir(cfg) / f"{name}.yaml"
    data = load_yaml(path)
    msgs = schema_errors(data, _schema(ABLATION_SCHEMA), [(_rel(path), data)])
    if not msgs and data.get("rl"):
        prof = _schema(PROFILE_SCHEMA)
        rl_schema = {"$defs": prof["$defs"], **prof["properties"]["rl"]}
        msgs = [f"rl.{m}" for m in schema_errors(data["rl"], rl_schema, [(_rel(path), data["rl"])])]
    if msgs:
        raise ConfigError(f"ablation {name!r} ({_rel(path)}):\n  " + "\n  ".join(msgs))
    return data


def recipe_mapping(
    name: str, cfg: dict[str, Any], _seen: tuple[str, ...] = ()
) -> tuple[dict[str, Any], list[Path]]:
    """The recipe mapping of configs/recipes/<name>.yaml with `extends` chains resolved through the
    recipes folder; a name with no file stays `{extends: name}` (minite.recipes' registry resolves it).
    Returns (mapping, the files it was read from)."""
    if name in _seen:
        raise ConfigError(f"recipe {name!r}: `extends` cycle {' -> '.join((*_seen, name))}")
    path = recipes_dir(cfg) / f"{name}.yaml"
    if not path.is_file():
        return {"extends": name}, []
    data = dict(load_yaml(path))
    files = [path]
    base = data.pop("extends", None)
    if base is not None:
        base_map, base_files = recipe_mapping(base, cfg, (*_seen, name))
        data = deep_merge({**base_map, "description": ""}, data)
        files = base_files + files
    return data, files


def run_names(cfg: dict[str, Any]) -> list[str]:
    return list(cfg["recipes"]) + list(cfg.get("ablations") or [])


def run_override(cfg: dict[str, Any], run: str) -> dict[str, Any]:
    """The profile's `run_overrides` entry of one run ({} if none): its own seeds and rl settings."""
    return dict((cfg.get("run_overrides") or {}).get(run) or {})


def run_seeds(cfg: dict[str, Any], run: str) -> list[int]:
    if "seeds" in run_override(cfg, run):
        return list(run_override(cfg, run)["seeds"])
    if run in cfg["recipes"]:
        return list(cfg["seeds"])
    return list(cfg.get("ablation_seeds") or cfg["seeds"][:1])


def is_ablation(cfg: dict[str, Any], run: str) -> bool:
    return run not in cfg["recipes"] and (ablations_dir(cfg) / f"{run}.yaml").is_file()


def known_ablations(cfg: dict[str, Any]) -> list[str]:
    """Every ablation file (the ones `rule all` runs and the ones runnable by target name)."""
    return [a for a in _names(ablations_dir(cfg)) if a not in cfg["recipes"]]


def resolve_run(cfg: dict[str, Any], run: str) -> dict[str, Any]:
    """Everything that defines one run: its recipe mapping, its rl settings, and the files they
    came from. Keys: run, recipe (the base recipe), ablation (None for a plain recipe), component,
    description, recipe_mapping, rl, files."""
    rl = deep_merge(dict(cfg.get("rl") or {}), run_override(cfg, run).get("rl") or {})
    if run in cfg["recipes"] or (recipes_dir(cfg) / f"{run}.yaml").is_file():
        mapping, files = recipe_mapping(run, cfg)
        return {
            "run": run,
            "recipe": run,
            "ablation": None,
            "component": "baseline",
            "description": mapping.get("description", ""),
            "recipe_mapping": {**mapping, "name": run},
            "rl": rl,
            "files": [str(f) for f in files],
        }
    path = ablations_dir(cfg) / f"{run}.yaml"
    if not path.is_file():
        raise ConfigError(_unknown("run (recipe or ablation)", run, ablations_dir(cfg), "run"))
    abl = load_ablation(run, cfg)
    over = dict(abl["recipe"])
    base = over.pop("extends")
    base_map, files = recipe_mapping(base, cfg)
    description = abl.get("description") or over.get("description") or ""
    mapping = deep_merge({**base_map, "description": ""}, over)
    mapping.update(name=run, description=description)
    return {
        "run": run,
        "recipe": base_map.get("name", base),
        "ablation": run,
        "component": abl.get("component", "other"),
        "description": description,
        "recipe_mapping": mapping,
        # the ablation's own rl settings, then the profile's run_overrides of this run (last word)
        "rl": deep_merge(deep_merge(rl, abl.get("rl") or {}), run_override(cfg, run).get("rl") or {}),
        "files": [str(f) for f in files] + [str(path)],
    }


# --- tracking ---------------------------------------------------------------------------------------


def tracking_uri(cfg: dict[str, Any], workdir: str | Path = ".") -> str:
    """MLFLOW_TRACKING_URI from the environment, else the profile's mlflow.tracking_uri, else a
    sqlite store at <workdir>/results/<profile>/mlflow.db."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    uri = (cfg.get("mlflow") or {}).get("tracking_uri")
    if uri:
        return uri
    db = Path(workdir).resolve() / "results" / cfg["profile"] / "mlflow.db"
    return f"sqlite:///{db}"


def experiment_name(cfg: dict[str, Any]) -> str:
    return (cfg.get("mlflow") or {}).get("experiment") or cfg["profile"]
