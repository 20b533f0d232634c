"""The progress helper: plain lines with an ETA off a terminal, silence when asked, rich on a terminal."""

import io

import pytest

from kernaudit_pipeline.core.progress import Progress, fmt_duration, mode


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_durations():
    assert [fmt_duration(s) for s in (0, 42, 185, 3720)] == ["0s", "42s", "3m05s", "1h02m"]


def test_plain_lines_carry_done_total_and_an_eta_and_are_throttled(monkeypatch):
    monkeypatch.delenv("KERNAUDIT_PROGRESS", raising=False)
    out, clock = io.StringIO(), Clock()
    with Progress("verify: recompiles", 4, stream=out, clock=clock) as bar:
        clock.now = 30.0
        bar.advance(note="cfg-a")  # 30 s per item so far: 90 s left
        clock.now = 31.0
        bar.advance(note="cfg-b")  # within 10 s of the last line: not printed
        clock.now = 60.0
        bar.advance(2)
    lines = out.getvalue().splitlines()
    assert lines[0] == "verify: recompiles 1/4 (25%) 30s elapsed, ETA 1m30s [cfg-a]"
    assert lines[1] == "verify: recompiles 4/4 (100%) 1m00s elapsed"  # the last one is always printed
    assert len(lines) == 2


def test_a_quick_task_prints_only_its_last_line(monkeypatch):
    monkeypatch.delenv("KERNAUDIT_PROGRESS", raising=False)
    out, clock = io.StringIO(), Clock()
    with Progress("compiling for sm_90", 2, stream=out, clock=clock) as bar:
        clock.now = 4.0
        bar.advance(2, note="done")
    assert out.getvalue().splitlines() == ["compiling for sm_90 2/2 (100%) 4s elapsed [done]"]


def test_an_interrupted_task_says_so(monkeypatch):
    monkeypatch.delenv("KERNAUDIT_PROGRESS", raising=False)
    out = io.StringIO()
    with pytest.raises(KeyError):
        with Progress("bench", 10, stream=out, clock=Clock()) as bar:
            bar.advance()
            raise KeyError("x")
    assert out.getvalue().splitlines()[-1].endswith("[stopped]")


def test_off_prints_nothing_and_rich_draws_on_a_terminal(monkeypatch):
    monkeypatch.setenv("KERNAUDIT_PROGRESS", "off")
    out = io.StringIO()
    with Progress("x", 2, stream=out) as bar:
        bar.advance(2)
    assert out.getvalue() == "" and mode(out) == "off"
    monkeypatch.delenv("KERNAUDIT_PROGRESS")
    tty = Tty()
    assert mode(tty) == "rich" and mode(io.StringIO()) == "plain"
    with Progress("compiles", 3, stream=tty) as bar:
        bar.advance(3, note="done")
    assert "compiles" in tty.getvalue() and "3/3" in tty.getvalue()
    monkeypatch.setenv("KERNAUDIT_PROGRESS", "plain")
    assert mode(Tty()) == "plain"
