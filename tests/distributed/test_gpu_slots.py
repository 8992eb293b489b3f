"""Local multi-GPU runs: concurrent jobs get disjoint GPUs (minite/distributed/gpus.py); on CPU the
GPUs are named by CUDA_VISIBLE_DEVICES, the locks are real."""

import os
import subprocess
import sys

from minite.distributed.gpus import gpus_for_verb

CLAIM = (
    "import sys, time; from minite.distributed.gpus import claim_for_verb; "
    "print(','.join(claim_for_verb(sys.argv[1], sys.argv[2])), flush=True); time.sleep(float(sys.argv[3]))"
)


def _start(tmp_path, verb, slots, hold, visible="0,1,2"):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible, "MINITE_GPU_LOCK_DIR": str(tmp_path)}
    return subprocess.Popen(
        [sys.executable, "-c", CLAIM, verb, slots, str(hold)], env=env, stdout=subprocess.PIPE, text=True
    )


def test_concurrent_jobs_get_disjoint_gpus(tmp_path):
    a = _start(tmp_path, "train", "2", 3.0)
    first = a.stdout.readline().strip().split(",")
    b = _start(tmp_path, "eval", "1", 0.0)
    second = b.stdout.readline().strip().split(",")
    assert len(first) == 2 and len(second) == 1
    assert not set(first) & set(second)
    assert b.wait(30) == 0 and a.wait(30) == 0
    # the locks went with the processes: all three are free again
    c = _start(tmp_path, "bench", "3", 0.0)
    assert sorted(c.stdout.readline().strip().split(",")) == ["0", "1", "2"]
    assert c.wait(30) == 0


def test_cpu_only_verbs_take_no_gpu():
    assert gpus_for_verb("resolve", "8") == 0 and gpus_for_verb("figures", "8") == 0
    assert gpus_for_verb("train", "paper") == 8 and gpus_for_verb("prepare", "paper") == 0
    assert gpus_for_verb("eval", "h200") == 1 and gpus_for_verb("train", "tiny") == 0
