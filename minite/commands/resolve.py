"""`minite resolve`: write what defines one workflow run, validated, as the files `minite train` reads.

The workflow's `run_config` rule calls it with the run's spec (from `minite.profiles.resolve_run`:
the recipe mapping after `extends`, the profile's rl section with the ablation's rl overrides) and
it writes, into --out:
    recipe.yaml   the full recipe (every field explicit), named after the run
    train.yaml    the full RL settings (TrainConfig fields except paths, recipe and seed)
    run.json      run / recipe / ablation / component / description / source files
Both YAMLs are validated by the dataclasses that will read them, so a bad value in an ablation file
fails here, in seconds, naming the file, before any RL starts.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from minite.commands.common import run_guarded
from minite.configuration import ConfigError, from_dict, to_dict

_RUN_KEYS = ("model_dir", "data_dir", "out_dir", "recipe", "seed")
_SPEC_KEYS = ("run", "recipe_mapping", "rl")  # required; the others (files, ablation, ...) optional
_SPEC_HELP = (
    "--spec takes one JSON object, the run spec of minite.profiles.resolve_run (the workflow's run_config "
    'rule passes it), with keys "run" (a name), "recipe_mapping" (a recipe, e.g. {"extends": "minite"}) and '
    '"rl" (TrainConfig fields, e.g. {"steps": 10}), keys and strings in double quotes; in a shell put '
    'single quotes around it: --spec \'{"run": "r", "recipe_mapping": {"extends": "minite"}, "rl": {}}\''
)
_JSON_TYPE = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


def parse_spec(text: str) -> dict:
    """The --spec JSON object, or a ConfigError that shows where it fails to parse and what to pass."""
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        line = text.splitlines()[e.lineno - 1] if text.strip() else ""
        col = e.colno - 1  # the failing line, 30 characters either side, marked at the position
        here = f"{line[max(0, col - 30) : col]}<HERE>{line[col : col + 30]}"
        raise ConfigError(
            f"--spec is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}: {here!r}; {_SPEC_HELP}"
        ) from e
    if not isinstance(spec, dict):
        kind = _JSON_TYPE.get(type(spec), "null")
        raise ConfigError(f"--spec is a JSON {kind}, not an object; {_SPEC_HELP}")
    missing = [k for k in _SPEC_KEYS if k not in spec]
    if missing:
        raise ConfigError(f"--spec: missing key(s) {missing}; {_SPEC_HELP}")
    for key in ("recipe_mapping", "rl"):
        if not isinstance(spec[key], dict):
            raise ConfigError(f"--spec: {key!r} must be a JSON object, got {spec[key]!r}; {_SPEC_HELP}")
    return spec


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="minite resolve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--spec", required=True, help="run spec JSON (minite.profiles.resolve_run)")
    p.add_argument("--out", required=True, help="folder for recipe.yaml, train.yaml, run.json")
    args = p.parse_args(argv)

    def go() -> int:
        from minite.recipes import recipe_from_dict
        from minite.rl.config import TrainConfig

        spec = parse_spec(args.spec)
        where = ", ".join(spec.get("files") or []) or spec["run"]
        recipe = recipe_from_dict(
            dict(spec["recipe_mapping"]), where=f"recipe of run {spec['run']} ({where})"
        )
        rl = dict(spec["rl"])
        bad = [k for k in _RUN_KEYS if k in rl]
        if bad:
            raise ConfigError(f"run {spec['run']}: rl settings may not set {bad} (the workflow sets them)")
        train = from_dict(
            TrainConfig,
            {**rl, "model_dir": "", "data_dir": "", "out_dir": ""},
            where=f"rl settings of run {spec['run']} ({where})",
        )
        train_dict = {k: v for k, v in to_dict(train).items() if k not in _RUN_KEYS}
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        header = f"# resolved by `minite resolve` for run {spec['run']!r} from: {where}\n"
        (out / "recipe.yaml").write_text(header + yaml.safe_dump(to_dict(recipe), sort_keys=False))
        (out / "train.yaml").write_text(header + yaml.safe_dump(train_dict, sort_keys=False))
        meta = {k: spec.get(k) for k in ("run", "recipe", "ablation", "component", "description", "files")}
        (out / "run.json").write_text(json.dumps(meta, indent=2) + "\n")
        print(f"minite resolve: {spec['run']} -> {out}")
        return 0

    return run_guarded(go)
