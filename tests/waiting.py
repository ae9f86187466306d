"""Waiting, in real time, for state that has no event to wait on."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

#: how often `wait_until` looks again
POLL_INTERVAL_S = 0.01


async def wait_until(condition: Callable[[], bool], timeout_s: float) -> None:
    """Poll `condition` in real time until it holds; fail after `timeout_s`.

    Only for state that changes in real threads (fdatasync, LevelDB, entry-log
    writes) or that the code under test exposes as a statistic without an event:
    trio's autojump clock would jump past the threads rather than wait for them, and
    `wait_all_tasks_blocked` counts a task waiting on a thread as blocked. Anything
    that can signal is awaited directly instead."""
    try:
        with trio.fail_after(timeout_s):
            while not condition():  # noqa: ASYNC110 - nothing here can signal
                await trio.sleep(POLL_INTERVAL_S)
    except trio.TooSlowError:
        code = condition.__code__
        raise AssertionError(
            f"the condition at {code.co_filename}:{code.co_firstlineno} did not hold "
            f"within {timeout_s} s"
        ) from None


async def wait_until_true(condition: Callable[[], Awaitable[bool]], timeout_s: float) -> None:
    """`wait_until` for a condition that has to await (a read of the metadata store
    by another process's lease, say)."""
    try:
        with trio.fail_after(timeout_s):
            while not await condition():  # noqa: ASYNC110 - nothing here can signal
                await trio.sleep(POLL_INTERVAL_S)
    except trio.TooSlowError:
        code = condition.__code__
        raise AssertionError(
            f"the condition at {code.co_filename}:{code.co_firstlineno} did not hold "
            f"within {timeout_s} s"
        ) from None
