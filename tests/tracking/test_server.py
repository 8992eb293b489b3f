"""The workflow's tracking server (minite.tracking.server) does not outlive the process that started it:
`stop` ends it, and so does that process dying by SIGKILL (no onsuccess/onerror hook runs then)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

from tests.mlflow_server import wait_until


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie (exited, not yet reaped by its parent) is gone too
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].startswith("Z")
    except FileNotFoundError:
        return True


def test_server_ends_when_its_parent_is_killed(tmp_path):
    from minite.tracking.store import wait_for_server

    parent = tmp_path / "parent.py"
    parent.write_text(
        textwrap.dedent(
            f"""
            import time
            from minite.tracking import server as TS

            TS.start({str(tmp_path / "results")!r}, "e")
            time.sleep(900)
            """
        )
    )
    proc = subprocess.Popen([sys.executable, str(parent)])
    info = tmp_path / "results" / "mlflow" / "server.json"
    try:
        wait_until(info.is_file, 400, "server.json (the server up and announced)")
        server = json.loads(info.read_text())
        wait_for_server(server["uri"], timeout=30)
        assert server["uri"].startswith("http://127.0.0.1:")
        assert (
            server["ui"]
            == f"{server['uri']}/#/experiments/{server['experiment_id']}?workflowType=machine_learning"
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    wait_until(lambda: _gone(server["server_pid"]) and _gone(server["supervisor_pid"]), 90, "server gone")
