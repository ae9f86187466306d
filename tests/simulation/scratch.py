"""Where a simulated run keeps its files: a temporary folder in memory (tmpfs) when
the machine has one.

The simulated disk decides what a sync makes durable and passes no sync to the OS,
but the metadata store is a real SQLite file, whose commits each fsync its WAL (a
stream run makes about a thousand). On tmpfs those syncs and the run's removal cost
nothing: a stream seed runs in about 60 % of the time it takes on the disk. No
invariant depends on the OS's syncs (the simulated machine never loses power; its
crashes are the simulated disk's), so the runs check exactly what they check on a
disk.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

#: Linux's tmpfs for shared memory, on every distribution the project runs on
MEMORY_FOLDER = Path("/dev/shm")


def scratch_folder(prefix: str) -> tempfile.TemporaryDirectory[str]:
    """A temporary folder named `prefix...`, removed when its `with` ends: under
    MEMORY_FOLDER if it is a writable folder here, else where `tempfile` puts one."""
    in_memory = MEMORY_FOLDER.is_dir() and os.access(MEMORY_FOLDER, os.W_OK | os.X_OK)
    return tempfile.TemporaryDirectory(prefix=prefix, dir=MEMORY_FOLDER if in_memory else None)
