"""Progress of long work: a redrawn bar on a terminal, periodic plain lines elsewhere."""

from __future__ import annotations

import io

from pora.tools.progress import Progress, format_bytes, format_duration


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_come_at_intervals_with_rate_and_eta() -> None:
    clock = FakeClock()
    out = io.StringIO()
    progress = Progress("verifying", 100 << 20, stream=out, interval_s=5.0, clock=clock)
    clock.now += 1
    progress.update(10 << 20)
    assert out.getvalue() == "", "nothing before the first interval"
    clock.now += 4
    progress.update(50 << 20)  # 50 MiB in 5 s: 10 MiB/s, 50 MiB left: 5 s
    clock.now += 1
    progress.update(60 << 20)  # not due yet
    lines = out.getvalue().splitlines()
    assert lines == ["verifying:  50.0% 50.0 MiB of 100.0 MiB, 10.0 MiB/s, ETA 0:05"]
    progress.finish()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[1].startswith("verifying: 100.0% 100.0 MiB of 100.0 MiB")
    assert "\r" not in out.getvalue()


def test_a_terminal_gets_one_redrawn_line_with_a_bar() -> None:
    clock = FakeClock()
    out = Terminal()
    with Progress("rebuilding", 1000, unit="entries", stream=out, clock=clock) as progress:
        for step in range(1, 5):
            clock.now += 1
            progress.update(step * 250)
    text = out.getvalue()
    assert text.startswith("\rrebuilding: [")
    assert text.count("\r") == 5  # four updates and the final draw
    assert text.endswith("\n")
    assert "[######......" in text and "25.0%" in text
    assert "250 entries/s" in text


def test_quick_work_prints_nothing() -> None:
    clock = FakeClock()
    out = io.StringIO()
    with Progress("scanning", 10, stream=out, clock=clock) as progress:
        progress.update(10)
    assert out.getvalue() == ""


def test_unknown_size_shows_elapsed_time_only() -> None:
    clock = FakeClock()
    out = io.StringIO()
    progress = Progress("replaying", None, unit="elapsed", stream=out, interval_s=1, clock=clock)
    clock.now += 65
    progress.update(0)
    assert out.getvalue() == "replaying: elapsed 1:05\n"


def test_formatting() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 << 30) == "3.0 GiB"
    assert format_duration(3725) == "1:02:05"
