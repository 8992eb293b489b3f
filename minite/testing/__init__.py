"""Hooks the product carries for its own tests, inert unless a test's environment turns them on.

- `fault_injection.py`: SIGKILL a process at a named point (`MINITE_FAULT_INJECT`), for the kill and
  resume tests (tests/rl/test_kill_resume.py, tests/distributed/test_train_dist.py).
"""
