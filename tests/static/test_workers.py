"""The timed worker pool on a handler of its own (tests/static/pool_handler.py): every way a task
or a worker can end becomes an outcome, never a hang."""

from __future__ import annotations

import pytest

from kernaudit_pipeline.static_resources.workers import OutcomeKind, WorkerPool

HANDLER = "tests.static.pool_handler"


def test_every_ending_is_an_outcome():
    tasks = [
        {"key": "ok", "action": "echo", "value": 41},
        {"key": "slow", "action": "sleep", "seconds": 60},
        {"key": "raises", "action": "raise"},
        {"key": "exits", "action": "exit"},
        {"key": "after", "action": "echo", "value": 42},
    ]
    done = []
    with WorkerPool(HANDLER, max_workers=2, start_timeout_s=60) as pool:
        out = pool.run(tasks, timeout_s=3, on_done=lambda t, o: done.append(t["key"]))
    assert sorted(done) == sorted(t["key"] for t in tasks)
    assert out["ok"].kind is OutcomeKind.OK and out["ok"].payload["echo"] == 41
    assert out["after"].kind is OutcomeKind.OK and out["after"].payload["echo"] == 42
    assert out["slow"].kind is OutcomeKind.TIMEOUT and "3 s timeout" in out["slow"].message
    assert out["raises"].kind is OutcomeKind.ERROR and out["raises"].deterministic
    assert out["raises"].message == "ValueError: bad task"
    assert out["exits"].kind is OutcomeKind.DIED and "exit code 7" in out["exits"].message


def test_an_exit_is_reported_with_the_code_the_task_gave():
    """sys.exit() in a task is that task's error (the worker stays); a worker whose pipe closes
    before it has exited is reported with its own exit code, not the -9 of the kill that
    follows."""
    tasks = [{"key": "sys_exit", "action": "sys_exit"}, {"key": "after", "action": "echo"},
             {"key": "close", "action": "close_then_exit"}]
    with WorkerPool(HANDLER, max_workers=1, start_timeout_s=60) as pool:
        out = pool.run(tasks, timeout_s=10)
    assert out["sys_exit"].kind is OutcomeKind.ERROR and out["sys_exit"].message == "SystemExit: 5"
    assert out["after"].kind is OutcomeKind.OK and out["after"].payload["done_in_this_worker"] == 2
    assert out["close"].kind is OutcomeKind.DIED and out["close"].message == "worker died (exit code 9)"


def test_workers_are_reused_across_runs():
    with WorkerPool(HANDLER, max_workers=1, start_timeout_s=60) as pool:
        first = pool.run([{"key": "a", "action": "echo"}], timeout_s=10)["a"].payload
        second = pool.run([{"key": "b", "action": "echo"}], timeout_s=10)["b"].payload
    assert first["pid"] == second["pid"] and second["done_in_this_worker"] == 2


def test_start_up_deadline_is_the_one_given():
    """A worker that cannot start within start_timeout_s is killed; once as many starts as
    workers (at least 2) failed, every task ends NOT_STARTED with the reason."""
    with WorkerPool(HANDLER, max_workers=1, start_timeout_s=2.5,
                    env={"KERNAUDIT_TEST_WARMUP_S": "600"}) as pool:
        out = pool.run([{"key": "a", "action": "echo"}, {"key": "b", "action": "echo"}], timeout_s=10)
    assert {o.kind for o in out.values()} == {OutcomeKind.NOT_STARTED}
    assert "did not start within 2.5 s" in out["a"].message


def test_bad_limits_are_refused():
    with pytest.raises(ValueError):
        WorkerPool(HANDLER, max_workers=0, start_timeout_s=1)
    with pytest.raises(ValueError):
        WorkerPool(HANDLER, max_workers=1, start_timeout_s=0)


def test_a_worker_ends_when_its_parent_is_killed(tmp_path):
    """A worker stuck in a task (here: sleeping) exits by itself once its parent is gone."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "parent.py"
    pid_file = tmp_path / "worker.pid"
    script.write_text(
        "import os, sys\n"
        "from kernaudit_pipeline.static_resources.workers import WorkerPool\n"
        "if __name__ == '__main__':\n"
        "    pool = WorkerPool('tests.static.pool_handler', max_workers=1, start_timeout_s=60)\n"
        "    pool.run([{'key': 'a', 'action': 'echo'}], timeout_s=30)\n"
        f"    open({str(pid_file)!r}, 'w').write(str(pool._workers[0].proc.pid))\n"
        "    pool.run([{'key': 'b', 'action': 'sleep', 'seconds': 600}], timeout_s=600)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
    parent = subprocess.Popen([sys.executable, str(script)], env=env)
    try:
        for _ in range(600):
            if pid_file.exists() and pid_file.read_text():
                break
            time.sleep(0.1)
        worker = int(pid_file.read_text())
        time.sleep(0.5)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        for _ in range(100):
            if not _alive(worker):
                break
            time.sleep(0.1)
        else:
            os.kill(worker, signal.SIGKILL)
            raise AssertionError("the worker outlived its killed parent")
    finally:
        if parent.poll() is None:
            parent.kill()


def _alive(pid: int) -> bool:
    """Running, and not a zombie waiting for a reaper."""
    try:
        with open(f"/proc/{pid}/status") as f:
            state = next((ln.split()[1] for ln in f if ln.startswith("State:")), "")
    except OSError:
        return False
    return state not in ("Z", "X")
