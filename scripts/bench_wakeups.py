"""What waking up costs on this machine: the floor under any low-rate latency figure.

A request at a low rate finds every process idle: the sender's `send()` on loopback
runs the receiver's TCP path and wakes it, and each event loop that sleeps in
`epoll_wait` pays for its wake-up. On a virtual machine both can cost far more than
the work a small request carries. This prints, per operation, the CPU time
(user + system, `getrusage`) of:

- an event loop woken by its own 1 ms timer: trio, asyncio, a bare `epoll.poll`;
- a 1 KiB `send()` over loopback TCP to a peer process that echoes one byte back,
  at a given rate (idle between requests) and back to back.

    python scripts/bench_wakeups.py [--seconds 2] [--rates 100 1000 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import resource
import select
import socket
import time
from collections.abc import Callable

import trio


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _per_operation_us(loop: Callable[[float], int], seconds: float) -> tuple[float, int]:
    """(CPU us per operation, operations per second) of `loop(seconds)`."""
    cpu = _cpu_s()
    count = loop(seconds)
    return (_cpu_s() - cpu) / max(1, count) * 1e6, int(count / seconds)


def trio_timer_wakes(seconds: float) -> int:
    async def run() -> int:
        count, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            await trio.sleep(0.001)
            count += 1
        return count

    return trio.run(run)


def asyncio_timer_wakes(seconds: float) -> int:
    async def run() -> int:
        count, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            await asyncio.sleep(0.001)
            count += 1
        return count

    return asyncio.run(run())


def epoll_timer_wakes(seconds: float) -> int:
    poller = select.epoll()
    count, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        poller.poll(0.001)
        count += 1
    poller.close()
    return count


def _echo_one_byte(listener: socket.socket) -> None:
    """The peer: answers every 1 KiB received with one byte (until the sender closes)."""
    connection, _ = listener.accept()
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pending = 0
    while chunk := connection.recv(65536):
        pending += len(chunk)
        answers, pending = divmod(pending, 1024)
        if answers:
            connection.sendall(b"k" * answers)


def loopback_sends(rate: float, seconds: float) -> tuple[float, float, int]:
    """(CPU us per send, CPU us per whole request, requests/s): 1 KiB requests to an
    echoing peer process, one at a time, `rate` per second (0: back to back)."""
    listener = socket.create_server(("127.0.0.1", 0))
    peer = multiprocessing.Process(target=_echo_one_byte, args=(listener,), daemon=True)
    peer.start()
    client = socket.create_connection(listener.getsockname())
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = b"x" * 1024
    send_cpu = 0.0
    count = 0
    cpu = _cpu_s()
    start = time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        if rate > 0:
            delay = start + count / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        before = _cpu_s()
        client.sendall(payload)
        send_cpu += _cpu_s() - before
        client.recv(1)
        count += 1
    total_cpu = _cpu_s() - cpu
    client.close()
    peer.join(5)
    listener.close()
    return send_cpu / count * 1e6, total_cpu / count * 1e6, int(count / seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    parser.add_argument("--rates", type=float, nargs="+", default=[100, 1000, 10000],
                        help="loopback request rates (back to back is added)")  # fmt: skip
    args = parser.parse_args()
    print(f"{'measure':<46} {'CPU us/op':>10} {'ops/s':>8}")
    for name, loop in (
        ("trio loop woken by a 1 ms timer", trio_timer_wakes),
        ("asyncio loop woken by a 1 ms timer", asyncio_timer_wakes),
        ("bare epoll.poll(1 ms)", epoll_timer_wakes),
    ):
        cpu_us, per_s = _per_operation_us(loop, args.seconds)
        print(f"{name:<46} {cpu_us:>10.1f} {per_s:>8,}")
    for rate in [*args.rates, 0.0]:
        send_us, request_us, per_s = loopback_sends(rate, args.seconds)
        label = f"{rate:,.0f}/s" if rate else "back to back"
        print(f"{'loopback 1 KiB send(), ' + label:<46} {send_us:>10.1f} {per_s:>8,}")
        print(f"{'  the whole request (send, wait, recv)':<46} {request_us:>10.1f}")


if __name__ == "__main__":
    main()
