# MLflow for this invocation: with no tracking URI given (common.smk: USER_TRACKING_URI), onstart starts
# `mlflow server` on 127.0.0.1 at a free port over results/<profile>/mlflow.db and mlartifacts/
# (minite/tracking/server.py) and points the jobs at it; onsuccess / onerror stop it (and it stops
# itself if Snakemake dies). Jobs open their runs when they start and stream their metrics; the link to
# watch them is printed and kept in results/<profile>/mlflow/server.json. A given URI (a cluster's
# server, or a sqlite:/file: store written directly, the offline option) is used as is. Jobs that run
# on other hosts (an executor such as SLURM) cannot reach a 127.0.0.1 server: they write the sqlite
# store directly unless a URI is given.
from minite.tracking import server as TS
from minite.tracking.store import SERVER_LOG_ENV, STORE_ENV, WAIT_ENV

_TRACKING = {}


def _tracking_python():
    """The interpreter of the jobs' `minite` (it has mlflow), else this one."""
    parts = shlex.split(MINITE)
    return parts[0] if len(parts) >= 3 and parts[1:3] == ["-m", "minite.cli"] else sys.executable


def start_tracking():
    if USER_TRACKING_URI:
        print(f"MLflow: jobs log to {USER_TRACKING_URI}")
        return
    if not workflow.local_exec:
        print(
            f"MLflow: jobs on other hosts write {os.environ['MLFLOW_TRACKING_URI']} directly; set "
            "mlflow.tracking_uri (or MLFLOW_TRACKING_URI) to your cluster's tracking server to watch them live"
        )
        return
    server = TS.start(RES, EXPERIMENT, python=_tracking_python())
    _TRACKING["server"] = server
    os.environ["MLFLOW_TRACKING_URI"] = server.uri
    os.environ[STORE_ENV] = server.store_uri
    os.environ[SERVER_LOG_ENV] = str(server.log)
    os.environ.setdefault(WAIT_ENV, "600")  # the first jobs may start while the server starts
    print(f"MLflow: starting a tracking server at {server.uri} for the jobs (log {server.log})")


def stop_tracking():
    server = _TRACKING.pop("server", None)
    if server is not None:
        TS.stop(server)


# Snakemake keeps one onstart handler (the last one defined), so the SLURM pre-submission check of
# common.smk runs here too, first: a refused request stops the run before a server is started.
onstart:
    slurm_preflight()
    start_tracking()


onsuccess:
    stop_tracking()


onerror:
    stop_tracking()
