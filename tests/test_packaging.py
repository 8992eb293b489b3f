"""The wheel must ship every subpackage (the list in pyproject.toml is explicit because kernels/ is
mapped to minite.kernels), and no top-level package named `kernels` may be installed."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _declared() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])


def test_every_subpackage_is_declared():
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "minite").rglob("__init__.py")} | {
        "minite.kernels"
    }
    assert found == _declared()


def test_kernels_folder_maps_into_minite():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert cfg["package-dir"]["minite.kernels"] == "kernels"
    assert "kernels" not in _declared()
