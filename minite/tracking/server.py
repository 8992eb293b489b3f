"""The workflow's MLflow tracking server: `mlflow server` on 127.0.0.1 at a free port, over the
profile's sqlite store (results/<profile>/mlflow.db) and artifact root (results/<profile>/mlartifacts),
for the length of one Snakemake invocation (workflows/tracking.smk starts it at `onstart` and stops it
at `onsuccess` / `onerror`).

    server = start(RES, EXPERIMENT)       # returns at once; the server comes up in the background
    ...jobs log to server.uri...
    stop(server)

`start` launches a supervisor (`python -m minite.tracking.server ...`, in its own session, so a
Ctrl-C in the terminal reaches the jobs, which end their runs KILLED, before the server goes) that runs
`mlflow server` in a process group of its own and ends that group when told (SIGTERM) or when its
parent, Snakemake, is gone however it ended (SIGKILL included): no server outlives its workflow. Once
the server answers /health the supervisor creates the experiment (with its model-training kind and
its artifact folder) and writes results/<profile>/mlflow/server.json (URI, store, UI link, pids) and
prints the UI link. Jobs wait for /health themselves (minite.tracking.store.wait_for_server): the server's
start-up (store migrations, the app import; ~50 s on a loaded 2-core machine) overlaps
the prepare stage instead of delaying it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

STARTUP_S = 600  # the most a server may take to answer /health before the supervisor gives up


@dataclass(frozen=True)
class Server:
    uri: str  # http://127.0.0.1:<port>
    store_uri: str  # sqlite:///.../mlflow.db
    pid: int  # the supervisor's
    info: Path  # server.json, written once the server is up
    log: Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(store_uri: str, artifacts: Path, port: int) -> list[str]:
    return [
        sys.executable,  # the supervisor runs in the Python the jobs use (start's `python`)
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        store_uri,
        "--artifacts-destination",
        str(artifacts),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]


def start(results_dir: str | Path, experiment: str, python: str = sys.executable) -> Server:
    """Launch the supervised server for results/<profile>/ (see the module docstring); `python`: the
    interpreter that has mlflow (the one the workflow's jobs run)."""
    res = Path(results_dir).resolve()
    folder = res / "mlflow"
    folder.mkdir(parents=True, exist_ok=True)
    info, log = folder / "server.json", folder / "server.log"
    info.unlink(missing_ok=True)
    store = f"sqlite:///{res / 'mlflow.db'}"
    port = free_port()
    cmd = [python, "-m", "minite.tracking.server", "--parent", str(os.getpid())]
    cmd += ["--store", store, "--artifacts", str(res / "mlartifacts"), "--port", str(port)]
    cmd += ["--experiment", experiment, "--info", str(info), "--log", str(log)]
    paths = [str(_repo()), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    proc = subprocess.Popen(cmd, start_new_session=True, env=env, stdin=subprocess.DEVNULL)
    return Server(uri=f"http://127.0.0.1:{port}", store_uri=store, pid=proc.pid, info=info, log=log)


def stop(server: Server, timeout: float = 60) -> None:
    """End the supervisor (which ends the server group) and reap it."""
    try:
        os.kill(server.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid, _ = os.waitpid(server.pid, os.WNOHANG)
        if pid:
            return
        time.sleep(0.2)
    os.kill(server.pid, signal.SIGKILL)
    os.waitpid(server.pid, 0)


def _repo() -> Path:
    return Path(__file__).resolve().parents[2]


def _healthy(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def _end_group(proc: subprocess.Popen, grace: float = 20) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace)


def _announce(uri: str, store: str, experiment: str, info: Path, pids: dict[str, int]) -> None:
    from minite.tracking.jobs import _client, _experiment_id
    from minite.tracking.store import ui_url

    exp_id = _experiment_id(_client(uri), experiment, uri)
    ui = ui_url(uri, exp_id)
    record = {"uri": uri, "store_uri": store, "experiment": experiment, "experiment_id": exp_id, "ui": ui}
    tmp = info.with_suffix(".tmp")
    tmp.write_text(json.dumps({**record, **pids, "started": time.time()}, indent=2) + "\n")
    tmp.replace(info)
    print(f"MLflow: tracking server {uri} (store {store}); watch the runs live at {ui}", flush=True)


def supervise(args: argparse.Namespace) -> int:
    uri = f"http://127.0.0.1:{args.port}"
    stop_now = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop_now.set())
    with open(args.log, "a") as log:
        proc = subprocess.Popen(
            server_command(args.store, Path(args.artifacts), args.port),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            up, deadline = False, time.monotonic() + STARTUP_S
            while not stop_now.wait(0.5):
                if os.getppid() != args.parent or proc.poll() is not None:
                    break  # Snakemake is gone (reparented), or the server died (its log says why)
                if not up and _healthy(uri):
                    up = True
                    os.environ["MINITE_MLFLOW_STORE"] = args.store  # the experiment's artifact folder
                    pids = {"supervisor_pid": os.getpid(), "server_pid": proc.pid}
                    try:
                        _announce(uri, args.store, args.experiment, Path(args.info), pids)
                    except Exception as e:  # noqa: BLE001 - the jobs create the experiment then
                        print(f"MLflow: server {uri} is up, but announcing it failed: {e}", flush=True)
                elif not up and time.monotonic() > deadline:
                    print(f"MLflow: server {uri} not up after {STARTUP_S} s; see {args.log}", flush=True)
                    break
        finally:
            _end_group(proc)
    return 0 if proc.returncode in (0, -signal.SIGTERM, None) or stop_now.is_set() else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minite.tracking.server", description=__doc__)
    p.add_argument("--parent", type=int, required=True, help="pid to outlive no longer than")
    p.add_argument("--store", required=True)
    p.add_argument("--artifacts", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--experiment", required=True)
    p.add_argument("--info", required=True)
    p.add_argument("--log", required=True)
    return supervise(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
