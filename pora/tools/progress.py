"""Progress of long operator work (replay, verify, rebuild), written to stderr.

On a terminal: one line redrawn in place, with a bar, the rate and the time left.
Elsewhere (a pipe, a log file, CI): a plain line every few seconds, so a log of a
long run shows it moving without filling up with redraws. Nothing is shown for work
that ends before the first report is due.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Final, TextIO

_BAR_WIDTH: Final = 24
#: seconds between redraws on a terminal, and between lines elsewhere
TERMINAL_INTERVAL_S: Final = 0.2
PLAIN_INTERVAL_S: Final = 5.0
_BYTE_UNITS: Final = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(count: float) -> str:
    """1536 -> '1.5 KiB'."""
    value = float(count)
    for unit in _BYTE_UNITS:
        if abs(value) < 1024 or unit == _BYTE_UNITS[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_duration(seconds: float) -> str:
    """75 -> '1:15'; 3725 -> '1:02:05'."""
    whole = max(0, int(seconds + 0.5))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """Reports `done` out of `total` units (bytes, or a count named by `unit`).

    Call `update(done)` as often as convenient: it draws at most once per interval.
    `total` may be None (unknown): then no bar and no time left are shown; with
    unit="elapsed" only the elapsed time is (work that cannot be measured). Use as a
    context manager, or call `finish()`.
    """

    def __init__(
        self,
        label: str,
        total: int | None,
        *,
        unit: str = "bytes",
        stream: TextIO | None = None,
        interval_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self._stream = sys.stderr if stream is None else stream
        self._terminal = _is_terminal(self._stream)
        if interval_s is None:
            interval_s = TERMINAL_INTERVAL_S if self._terminal else PLAIN_INTERVAL_S
        self._interval_s = interval_s
        self._clock = clock
        self._started = clock()
        self._next_report = self._started + interval_s
        self._shown = False
        self._finished = False
        self.done = 0

    def update(self, done: int) -> None:
        """Record that `done` units (in all) are complete; report if one is due."""
        self.done = done
        now = self._clock()
        if now >= self._next_report:
            self._next_report = now + self._interval_s
            self._report(now)

    def advance(self, units: int) -> None:
        self.update(self.done + units)

    def finish(self) -> None:
        """Draw the final state (if anything was shown) and end the terminal line."""
        if self._finished:
            return
        self._finished = True
        if self._shown:
            if self.total is not None:
                self.done = max(self.done, self.total)
            self._report(self._clock())
            if self._terminal:
                self._stream.write("\n")
                self._stream.flush()

    def line(self, now: float) -> str:
        """The progress text at time `now` (without bar redraw control characters)."""
        elapsed = max(now - self._started, 1e-9)
        rate = self.done / elapsed
        parts = [self.label + ":"]
        if self.unit == "elapsed":  # work whose size is unknown: only say it is alive
            return f"{self.label}: elapsed {format_duration(elapsed)}"
        total = self.total
        if total:
            fraction = min(self.done / total, 1.0)
            if self._terminal:
                filled = int(fraction * _BAR_WIDTH)
                parts.append("[" + "#" * filled + "." * (_BAR_WIDTH - filled) + "]")
            parts.append(f"{fraction * 100:5.1f}%")
            parts.append(f"{self._amount(self.done)} of {self._amount(total)},")
        else:
            parts.append(f"{self._amount(self.done)},")
        parts.append(f"{self._amount(rate)}/s,")
        if total and rate > 0 and self.done < total:
            parts.append(f"ETA {format_duration((total - self.done) / rate)}")
        else:
            parts.append(f"elapsed {format_duration(elapsed)}")
        return " ".join(parts)

    def _amount(self, value: float) -> str:
        if self.unit == "bytes":
            return format_bytes(value)
        return f"{value:,.0f} {self.unit}"

    def _report(self, now: float) -> None:
        text = self.line(now)
        if self._terminal:
            # back to the line start, draw, clear what a longer earlier line left
            self._stream.write("\r" + text + "\x1b[K")
        else:
            self._stream.write(text + "\n")
        self._stream.flush()
        self._shown = True

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.finish()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or fake stream
        return False
