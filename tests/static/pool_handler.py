"""A worker-pool handler for the pool's own tests: tasks that sleep, raise, exit or answer.

``warm_up`` sleeps ``KERNAUDIT_TEST_WARMUP_S`` seconds (default 0) to stand for a slow start.
"""

from __future__ import annotations

import os
import time


def warm_up() -> None:
    time.sleep(float(os.environ.get("KERNAUDIT_TEST_WARMUP_S", "0")))


def handle(task: dict, state: dict) -> object:
    state["done"] = state.get("done", 0) + 1
    action = task["action"]
    if action == "sleep":
        time.sleep(task["seconds"])
        return "slept"
    if action == "raise":
        raise ValueError("bad task\nsecond line")
    if action == "exit":
        os._exit(7)
    if action == "sys_exit":  # what a kernel module's own sys.exit() does inside a task
        raise SystemExit(5)
    if action == "close_then_exit":  # the pipe closes before the process ends (interpreter clean-up)
        os.closerange(3, 4096)
        time.sleep(0.3)
        os._exit(9)
    return {"echo": task.get("value"), "pid": os.getpid(), "done_in_this_worker": state["done"]}


def is_deterministic(exc: BaseException) -> bool:
    return isinstance(exc, ValueError)
