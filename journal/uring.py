"""fdatasync through io_uring: a journal sync with no Python thread in its path.

A sync in a worker thread costs two hand-offs besides the sync itself: the thread
must be woken and take the GIL to start it, and take the GIL again to tell the
event loop it is over. Under load, with the event loop holding the GIL most of the
time, those lengthen every group commit (figures: docs/performance.md). Through
io_uring the event loop submits the fdatasync with one system call; the kernel
runs it in its own worker and posts a completion, which an eventfd registered with
the ring makes readable for the loop's epoll. No thread of ours wakes and nothing
waits for the GIL.

Only the few parts of io_uring a sync needs are used (setup, one mmap for the
rings, submit, eventfd completions), through `ctypes`, so nothing has to be
compiled. The rings are shared memory with the kernel: the kernel orders its side
with barriers, and on x86-64 (total store order) plain loads and stores give the
acquire and release order ours need. So the ring is used on x86-64 Linux only; on
anything else, or when the kernel refuses io_uring (seccomp, old kernel,
`kernel.io_uring_disabled`), `FdatasyncRing.open` returns None and the journal syncs in
a worker thread as before.

A completion the kernel cannot post to the completion ring goes to its overflow
list instead, and then the eventfd is not signalled. Kernel 6.18 does so with the
ring far from full (two syncs in flight, a ring of four), and every sync after it
goes the same way: unread, the node's writes would stall for good. So every
look at the ring also checks the overflow flag and, when it is set, asks the
kernel to flush that list into the ring (`io_uring_enter` with GETEVENTS), as
liburing does; and the reaper looks on its own after a while with syncs in flight
and no signal (journal/syncs.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import platform
import struct
import sys
from collections.abc import Callable
from typing import Final

# x86-64 system call numbers (the same on every kernel that has io_uring)
_SYS_IO_URING_SETUP: Final = 425
_SYS_IO_URING_ENTER: Final = 426
_SYS_IO_URING_REGISTER: Final = 427

_IORING_OFF_SQ_RING: Final = 0
_IORING_OFF_SQES: Final = 0x10000000
_IORING_FEAT_SINGLE_MMAP: Final = 1 << 0
_IORING_OP_FSYNC: Final = 3
_IORING_FSYNC_DATASYNC: Final = 1 << 0
_IORING_REGISTER_EVENTFD: Final = 4
_IORING_ENTER_GETEVENTS: Final = 1 << 0
#: in the SQ ring's flags: completions wait in the kernel's overflow list
_IORING_SQ_CQ_OVERFLOW: Final = 1 << 1

# struct io_uring_params: sq_entries, cq_entries, flags, sq_thread_cpu,
# sq_thread_idle, features, wq_fd, resv[3]; then io_sqring_offsets (head, tail,
# ring_mask, ring_entries, flags, dropped, array, resv1, user_addr u64) and
# io_cqring_offsets (head, tail, ring_mask, ring_entries, overflow, cqes, flags,
# resv1, user_addr u64)
_PARAMS: Final = struct.Struct("<10I 8IQ 8IQ")
assert _PARAMS.size == 120
# struct io_uring_sqe, as a sync uses it: opcode, flags, ioprio, fd, off, addr, len,
# fsync_flags, user_data, then 24 bytes of zeros (buf_index ... pad)
_SQE: Final = struct.Struct("<BBHiQQIIQ24x")
assert _SQE.size == 64
# struct io_uring_cqe: user_data, res, flags
_CQE: Final = struct.Struct("<QiI")
_U32: Final = struct.Struct("<I")

#: completions the ring holds; a journal has at most syncs_in_flight_max in flight
RING_ENTRIES_MAX: Final = 4096


class FdatasyncRing:
    """An io_uring that runs fdatasyncs. Not thread-safe: one event loop uses it."""

    def __init__(
        self,
        ring_fd: int,
        event_fd: int,
        rings: mmap.mmap,
        sqes: mmap.mmap,
        sq: tuple[int, int, int, int, int],
        cq: tuple[int, int, int, int],
        entries: int,
        enter: Callable[..., int],
    ) -> None:
        self._ring_fd = ring_fd
        #: readable when completions were posted (the loop waits on it)
        self.event_fd = event_fd
        self._rings = rings
        self._sqes = sqes
        self._sq_head, self._sq_tail, self._sq_mask, self._sq_array, self._sq_flags = sq
        self._cq_head, self._cq_tail, self._cq_mask, self._cqes = cq
        self._entries = entries
        self._enter = enter
        #: submitted and not yet completed
        self.in_flight = 0
        #: times completions were found in the kernel's overflow list and flushed
        self.overflow_flushes = 0

    @classmethod
    def open(cls, entries: int) -> FdatasyncRing | None:
        """A ring for `entries` syncs in flight, or None where io_uring cannot be used."""
        if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
            return None
        entries = 1 << max(entries - 1, 0).bit_length()  # a power of two
        if entries > RING_ENTRIES_MAX:
            return None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            syscall = libc.syscall
        except (OSError, AttributeError):
            return None
        syscall.restype = ctypes.c_long
        params = ctypes.create_string_buffer(_PARAMS.size)
        ring_fd = syscall(_SYS_IO_URING_SETUP, ctypes.c_uint(entries), params)
        if ring_fd < 0:
            return None  # ENOSYS, EPERM (seccomp, io_uring_disabled), ...
        try:
            return cls._map(ring_fd, _PARAMS.unpack(params.raw), syscall)
        except (OSError, ValueError):
            os.close(ring_fd)
            return None

    @classmethod
    def _map(
        cls, ring_fd: int, fields: tuple[int, ...], syscall: Callable[..., int]
    ) -> FdatasyncRing:
        """Map the rings of a new io_uring and register an eventfd for completions."""
        sq_entries, cq_entries, _flags, _cpu, _idle, features = fields[:6]
        sq_off, cq_off = fields[10:19], fields[19:28]
        if not features & _IORING_FEAT_SINGLE_MMAP:
            raise OSError(errno.ENOTSUP, "io_uring without a single ring mapping (kernel < 5.4)")
        rings_bytes = max(sq_off[6] + sq_entries * 4, cq_off[5] + cq_entries * _CQE.size)
        rings = mmap.mmap(ring_fd, rings_bytes, offset=_IORING_OFF_SQ_RING)
        sqes = mmap.mmap(ring_fd, sq_entries * _SQE.size, offset=_IORING_OFF_SQES)
        event_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        fd_array = (ctypes.c_int * 1)(event_fd)
        if syscall(_SYS_IO_URING_REGISTER, ring_fd, _IORING_REGISTER_EVENTFD, fd_array, 1):
            error = ctypes.get_errno()
            os.close(event_fd)
            raise OSError(error, "io_uring_register(EVENTFD) failed")
        sq_mask = _U32.unpack_from(rings, sq_off[2])[0]
        cq_mask = _U32.unpack_from(rings, cq_off[2])[0]
        return cls(
            ring_fd,
            event_fd,
            rings,
            sqes,
            (sq_off[0], sq_off[1], sq_mask, sq_off[6], sq_off[4]),
            (cq_off[0], cq_off[1], cq_mask, cq_off[5]),
            sq_entries,
            syscall,
        )

    def submit_fdatasync(self, fd: int, tag: int) -> None:
        """Start an fdatasync of `fd`; its completion comes back with `tag`."""
        if self.in_flight >= self._entries:
            raise RuntimeError(f"{self.in_flight} syncs in flight: the ring holds {self._entries}")
        rings = self._rings
        tail = _U32.unpack_from(rings, self._sq_tail)[0]
        index = tail & self._sq_mask
        _SQE.pack_into(
            self._sqes,
            index * _SQE.size,
            _IORING_OP_FSYNC,
            0,
            0,
            fd,
            0,
            0,
            0,
            _IORING_FSYNC_DATASYNC,
            tag,
        )
        _U32.pack_into(rings, self._sq_array + index * 4, index)
        # the entry is written before the tail that publishes it (x86-64: in order)
        _U32.pack_into(rings, self._sq_tail, (tail + 1) & 0xFFFFFFFF)
        submitted = self._enter_checked(1, 0)
        if submitted != 1:
            # the entry stays in the ring unsubmitted: this ring cannot be trusted
            raise OSError(errno.EIO, f"io_uring_enter submitted {submitted}, not 1")
        self.in_flight += 1

    def _enter_checked(self, to_submit: int, flags: int) -> int:
        """io_uring_enter, retried when interrupted; never waits for completions."""
        while True:
            result = self._enter(_SYS_IO_URING_ENTER, self._ring_fd, to_submit, 0, flags, None, 0)
            if result >= 0:
                return result
            error = ctypes.get_errno()
            if error != errno.EINTR:
                raise OSError(error, f"io_uring_enter failed: {os.strerror(error)}")

    @property
    def posted(self) -> int:
        """Completions waiting in the ring, not yet taken by `completions`."""
        rings = self._rings
        tail: int = _U32.unpack_from(rings, self._cq_tail)[0]
        head: int = _U32.unpack_from(rings, self._cq_head)[0]
        return (tail - head) & 0xFFFFFFFF

    @property
    def overflowed(self) -> bool:
        """Completions wait in the kernel's overflow list (`completions` flushes them)."""
        return bool(_U32.unpack_from(self._rings, self._sq_flags)[0] & _IORING_SQ_CQ_OVERFLOW)

    def completions(self) -> list[tuple[int, int]]:
        """The completions posted so far, as (tag, result): result 0, or -errno.
        Completions held in the kernel's overflow list are flushed and included."""
        with contextlib.suppress(BlockingIOError):  # nothing new since the last look
            os.eventfd_read(self.event_fd)
        done = self._take_posted()
        if self.overflowed:
            # read after the ring: a completion that overflowed after our look at the
            # ring has set the flag by now, and is flushed below
            self.overflow_flushes += 1
            self._enter_checked(0, _IORING_ENTER_GETEVENTS)
            done += self._take_posted()
        self.in_flight -= len(done)
        return done

    def _take_posted(self) -> list[tuple[int, int]]:
        rings = self._rings
        head = _U32.unpack_from(rings, self._cq_head)[0]
        tail = _U32.unpack_from(rings, self._cq_tail)[0]
        done: list[tuple[int, int]] = []
        while head != tail:
            tag, result, _flags = _CQE.unpack_from(
                rings, self._cqes + (head & self._cq_mask) * _CQE.size
            )
            done.append((tag, result))
            head = (head + 1) & 0xFFFFFFFF
        # read before the head that gives the slots back (x86-64: in order)
        _U32.pack_into(rings, self._cq_head, head)
        return done

    def close(self) -> None:
        """Close the ring. Only once nothing is in flight: a sync still running keeps
        its file open in the kernel, but its completion would be lost."""
        self._rings.close()
        self._sqes.close()
        os.close(self._ring_fd)
        os.close(self.event_fd)
