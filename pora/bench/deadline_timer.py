"""Waiting until a point in time to within tens of microseconds, on any event loop.

An event loop's own sleep is not precise enough for an open-loop load: trio and
asyncio wait in `epoll_wait`, whose timeout Python rounds up to whole milliseconds,
and uvloop's timers count milliseconds. An open loop at 500/s woken that way starts
each operation 0.5 ms late on average, and the lateness counts against every
latency it measures. A timerfd armed at the absolute deadline becomes readable
when the kernel's high-resolution timer fires, and the event loop waits for it like
for any file descriptor: the wake-up is the loop's usual one, without a spin and
without a thread. Deadlines are on
`time.perf_counter()`'s clock, which on Linux is CLOCK_MONOTONIC (checked).

Linux only (so is the project). `os.timerfd_create` arrived in Python 3.13; before
it, the two calls go through libc.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import time
from typing import Final

import anyio

__all__ = ["DeadlineTimer"]

CLOCK_MONOTONIC: Final = 1
TFD_TIMER_ABSTIME: Final = 1
TFD_NONBLOCK: Final = os.O_NONBLOCK
TFD_CLOEXEC: Final = os.O_CLOEXEC


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class _Libc:
    """timerfd_create and timerfd_settime through libc (Python before 3.13)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self._create = libc.timerfd_create
        self._create.argtypes = [ctypes.c_int, ctypes.c_int]
        self._settime = libc.timerfd_settime
        self._settime.argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(_Itimerspec),
            ctypes.POINTER(_Itimerspec),
        ]

    def create(self) -> int:
        fd = int(self._create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC))
        if fd < 0:
            error = ctypes.get_errno()
            raise OSError(error, f"timerfd_create: {os.strerror(error)}")
        return fd

    def arm_at(self, fd: int, deadline_ns: int) -> None:
        spec = _Itimerspec()
        spec.it_value.tv_sec, spec.it_value.tv_nsec = divmod(max(1, deadline_ns), 1_000_000_000)
        if self._settime(fd, TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"timerfd_settime: {os.strerror(error)}")


class DeadlineTimer:
    """One timerfd, re-armed for each wait; `close` it when done (or use `with`)."""

    def __init__(self) -> None:
        if "CLOCK_MONOTONIC" not in time.get_clock_info("perf_counter").implementation:
            raise RuntimeError("DeadlineTimer needs perf_counter on CLOCK_MONOTONIC (Linux)")
        self._libc = _Libc()
        self._fd = self._libc.create()

    async def wait_until(self, deadline: float) -> None:
        """Return at `deadline` on `time.perf_counter()`'s clock (at once if it has
        passed), after one checkpoint of the running event loop."""
        if deadline <= time.perf_counter():
            await anyio.lowlevel.checkpoint()
            return
        self._libc.arm_at(self._fd, round(deadline * 1e9))
        await anyio.wait_readable(self._fd)
        with contextlib.suppress(BlockingIOError):
            os.read(self._fd, 8)  # the expiry count: read, so the fd is quiet again

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> DeadlineTimer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
