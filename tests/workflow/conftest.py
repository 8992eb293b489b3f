"""Fixtures of the workflow tests (helpers live in workflow_helpers.py)."""

from pathlib import Path

import pytest


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    return d
