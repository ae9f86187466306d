"""A node's data directory: its layout, its format marker, and its lock.

<data-dir>/PORA       marker: JSON {"format": "pora-data", "version": 1, ...}
<data-dir>/CLUSTER    the cluster the node joined: JSON {"cluster_id": ..., ...}; none
                      until the node first registers in a metadata store
<data-dir>/LOCK       held (flock) by the one process using the dir; holds its pid
<data-dir>/journal/   journal segments and the journal watermark (WATERMARK, version 6 on)
<data-dir>/ledgers/   entry logs, <ledger_id & 0xff as 2 hex>/<ledger_id as 16 hex>.log
<data-dir>/index/     the LevelDB index
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from journal.errors import PoraError
from journal.fileio import fsync_directory
from journal.watermark import (
    WATERMARK_NAME,
    JournalState,
    Watermark,
    read_watermark,
    write_watermark,
)

DATA_DIR_FORMAT: Final = "pora-data"
# Versions of the directory layout and of every file format in it, as one number:
#   1: initial layout (journal v1, entry log v1, index v1).
#   2: journal v2, entry log v2, ledger metadata v2 (master keys, LAC, state records).
#   3: index v2 (positions stored by run: one key per flush, not one per entry).
#   4: journal v3 (an ENTRY record carries a run of consecutive entries).
#   5: journal segments may be recycled: a spare made of a trimmed segment keeps
#      its bytes, which readers before it would take for corruption. A node
#      upgrades a version 4 dir in place when it starts (nothing else changed).
#   6: journal/WATERMARK, the first journal seq the journal must still hold, must
#      exist: a missing one is reported, not taken for a journal that never trimmed.
#      A node upgrades a version 4 or 5 dir in place when it starts, writing an EMPTY
#      watermark at seq 0 (it asks for nothing: what such a dir lost before cannot
#      be known) before the marker says 6.
DATA_DIR_VERSION: Final = 6
#: versions this build opens; a node rewrites an older one's marker as it starts
READABLE_VERSIONS: Final = (4, 5, 6)
#: the first version whose journal keeps a watermark
WATERMARK_VERSION_MIN: Final = 6
MARKER_NAME: Final = "PORA"
CLUSTER_NAME: Final = "CLUSTER"
LOCK_NAME: Final = "LOCK"


class DataDirError(PoraError):
    """The data directory cannot be used."""


class DataDirLocked(DataDirError):
    pass


class IndexMissing(DataDirError):
    """Entry logs exist but the index that locates their entries does not (or holds
    nothing): started as it is, a node would show no ledgers, and a new add to one
    of them would be written over its log."""


@dataclass(frozen=True, slots=True)
class DataDir:
    root: Path
    instance_id: str
    #: the marker's version: one of READABLE_VERSIONS
    version: int = DATA_DIR_VERSION

    @property
    def journal_dir(self) -> Path:
        return self.root / "journal"

    @property
    def journal_watermark_required(self) -> bool:
        """Whether journal/WATERMARK must exist (journal/watermark.py)."""
        return self.version >= WATERMARK_VERSION_MIN

    @property
    def ledgers_dir(self) -> Path:
        return self.root / "ledgers"

    @property
    def index_dir(self) -> Path:
        return self.root / "index"


def open_data_dir(root: Path, *, create: bool = True) -> DataDir:
    """Check that `root` is a Pora data dir of a version we know (creating it if empty)."""
    root = root.absolute()
    if root.exists() and not root.is_dir():
        raise DataDirError(
            f"{root} is a file, not a directory. Point --data-dir at a Pora data dir or at "
            "an empty or new folder"
        )
    if create:
        _check_writable(root)
    marker = root / MARKER_NAME
    if not marker.exists():
        if root.exists() and not _only_initialisation_leftovers(root):
            raise DataDirError(
                f"{root} is not a Pora data dir: it is not empty and has no {MARKER_NAME} "
                "marker. Point --data-dir at a Pora data dir or at an empty or new folder"
            )
        if not create:
            raise DataDirError(f"{root} is not a Pora data dir (no {MARKER_NAME} marker)")
        return _initialise(root)
    try:
        info = json.loads(marker.read_text())
        fmt, version, instance_id = info["format"], info["version"], info["instance_id"]
    except (ValueError, KeyError, TypeError) as exc:
        raise DataDirError(f"{marker} is damaged ({exc}); it should be a JSON object") from exc
    if fmt != DATA_DIR_FORMAT:
        raise DataDirError(f"{root} holds {fmt!r} data, not {DATA_DIR_FORMAT!r}")
    if version not in READABLE_VERSIONS:
        raise DataDirError(
            f"{root} is a Pora data dir of format version {version}; this build reads "
            f"versions {', '.join(map(str, READABLE_VERSIONS))}. Use a Pora release that "
            f"knows version {version}"
        )
    return DataDir(root, str(instance_id), int(version))


def _user() -> str:
    uid = os.geteuid()
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _owner(path: Path) -> str:
    uid = path.stat().st_uid
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _check_writable(root: Path) -> None:
    """Refuse, before anything is written, a data dir (or the folder it would be made
    in) this process cannot write: a node run as the wrong user, a read-only mount."""
    existing = root
    while not existing.exists():
        existing = existing.parent
    folders = [existing]
    if existing == root:  # the node writes in these too, and in files made by an owner
        folders += [p for p in (root / "journal", root / "ledgers", root / "index") if p.is_dir()]
    for folder in folders:
        if not os.access(folder, os.W_OK | os.X_OK):
            what = "data dir" if folder == root else f"folder {folder.name}/ of data dir {root}"
            if existing != root:
                what = f"folder in which to make data dir {root}"
            raise DataDirError(
                f"the {what} ({folder}) is not writable by {_user()}: it is owned by "
                f"{_owner(folder)} with mode {folder.stat().st_mode & 0o7777:o}"
                f"{' on a read-only filesystem' if _read_only_mount(folder) else ''}. Run "
                "the node as the user that owns the data dir, or give this user write "
                "access to it (chown -R / chmod)"
            )


def _read_only_mount(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def upgrade_data_dir(directory: DataDir) -> DataDir:
    """Mark an older data dir (READABLE_VERSIONS) as DATA_DIR_VERSION, keeping its
    instance id and creation time: for a node about to write in the newer way, with
    the dir's lock held. Returns the dir as it is now."""
    if directory.version == DATA_DIR_VERSION:
        return directory
    marker = directory.root / MARKER_NAME
    info = json.loads(marker.read_text())
    if directory.version < WATERMARK_VERSION_MIN and read_watermark(directory.journal_dir) is None:
        _write_initial_watermark(directory.journal_dir)
    info["version"] = DATA_DIR_VERSION
    _write_marker(directory.root, info)
    return DataDir(directory.root, directory.instance_id, DATA_DIR_VERSION)


def _initialise(root: Path) -> DataDir:
    root.mkdir(parents=True, exist_ok=True)
    # before the marker: once it says version 6, the watermark must exist
    _write_initial_watermark(root / "journal")
    instance_id = uuid.uuid4().hex
    info = {
        "format": DATA_DIR_FORMAT,
        "version": DATA_DIR_VERSION,
        "instance_id": instance_id,
        "created_ms": time.time_ns() // 1_000_000,
    }
    _write_marker(root, info)
    return DataDir(root, instance_id)


def _write_initial_watermark(journal_dir: Path) -> None:
    """An EMPTY watermark at seq 0: the journal must hold nothing yet (recovery then
    sets it as it goes)."""
    write_watermark(journal_dir, Watermark(JournalState.EMPTY, 0))


def _only_initialisation_leftovers(root: Path) -> bool:
    """Whether `root` holds nothing, or only what `_initialise` writes before the
    marker (a crash cut it short): then it is still a new, empty data dir."""
    leftovers = {"journal", MARKER_NAME + ".tmp"}
    names = set(os.listdir(root))
    if not names <= leftovers:
        return False
    journal = root / "journal"
    return not journal.exists() or set(os.listdir(journal)) <= {
        WATERMARK_NAME,
        WATERMARK_NAME + ".tmp",
    }


def _write_marker(root: Path, info: dict[str, object]) -> None:
    """Replace the marker atomically and durably."""
    _write_json(root, MARKER_NAME, info)


def _write_json(root: Path, name: str, info: dict[str, object]) -> None:
    """Replace `root/name` by `info` as JSON, atomically and durably."""
    tmp = root / (name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(info, f)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / name)
    fsync_directory(root)


def new_instance(directory: DataDir) -> DataDir:
    """Give the data dir a fresh instance id (with its lock held, before the node
    serves): for a dir found behind what its instance once acknowledged, whose old
    answers must count as another node's from now on. The marker keeps the id it
    replaces, for the operator."""
    marker = directory.root / MARKER_NAME
    info = json.loads(marker.read_text())
    info["instance_id"] = uuid.uuid4().hex
    info["replaced_instance_id"] = directory.instance_id
    info["replaced_ms"] = time.time_ns() // 1_000_000
    _write_marker(directory.root, info)
    return DataDir(directory.root, str(info["instance_id"]), directory.version)


def read_cluster_id(root: Path) -> str | None:
    """The cluster id the data dir at `root` joined (CLUSTER), or None if it never
    joined one (or does not exist yet)."""
    path = root / CLUSTER_NAME
    try:
        text = path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        cluster_id = json.loads(text)["cluster_id"]
    except (ValueError, KeyError, TypeError) as exc:
        raise DataDirError(
            f"{path} is damaged ({exc}); it should be a JSON object with the id of the "
            "cluster this data dir belongs to. Restore it, or write "
            '{"cluster_id": "<id from `pora nodes` or the metadata store>"} into it'
        ) from exc
    if not isinstance(cluster_id, str) or not cluster_id:
        raise DataDirError(f"{path} names no cluster id ({cluster_id!r})")
    return cluster_id


def record_cluster_id(directory: DataDir, cluster_id: str, metadata_url: str) -> None:
    """Say durably that the data dir belongs to `cluster_id` (joined via `metadata_url`)."""
    _write_json(
        directory.root,
        CLUSTER_NAME,
        {
            "cluster_id": cluster_id,
            "metadata": metadata_url,
            "joined_ms": time.time_ns() // 1_000_000,
        },
    )


class DataDirLock:
    """An exclusive flock on <data-dir>/LOCK, released when the process dies."""

    def __init__(self, root: Path) -> None:
        self.path = root / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except PermissionError as error:
            raise DataDirError(
                f"cannot take the lock {self.path} ({error.strerror}) as {_user()}: the "
                f"data dir {self.path.parent} belongs to {_owner(self.path.parent)}. Run "
                "as that user, or give this user write access to the data dir"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DataDirLocked(
                f"data dir {self.path.parent} is in use by another Pora process (pid {holder}, "
                f"lock {self.path}); stop that node first, or use another --data-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> DataDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def refuse_entry_logs_without_index(directory: DataDir, *, index_empty: bool = False) -> None:
    """Raise IndexMissing if entry logs exist while the index has no LevelDB
    `CURRENT` file (it was lost or removed), or is `index_empty` (the caller opened
    it and found no ledger in it: an index created afresh next to old logs) and no
    journal segment could explain the logs.

    The one check for `open_node` and `pora recover`: a node must never start its
    ledgers over on top of their logs. `pora verify --rebuild-index` rebuilds the
    index from the logs (and the journal).
    """
    index_dir = directory.index_dir
    if not index_empty and (index_dir / "CURRENT").exists():
        return
    if index_empty and _has_journal_segments(directory.journal_dir):
        # also what a crash in a new node's first flush leaves (the log created and
        # written, the index batch not yet): the journal still holds those entries,
        # and its replay writes the same bytes at the same place. A log it would not
        # rewrite identically fails that flush instead (EntryLog.create)
        return
    logs = count_entry_logs(directory.ledgers_dir)
    if not logs:
        return  # a new node, or one whose ledgers were all deleted
    what = (
        "holds no ledger"
        if index_empty
        else "is missing"
        if not index_dir.exists()
        else "has no LevelDB CURRENT file"
    )
    raise IndexMissing(
        f"the index {index_dir} {what} but {logs} entry logs exist in "
        f"{directory.ledgers_dir}: started like this, the node would show none of their "
        "ledgers and a new add could overwrite their entries. Rebuild the index from the "
        f"entry logs and the journal with `pora verify --rebuild-index --data-dir "
        f"{directory.root}`, then start the node again"
    )


def count_entry_logs(ledgers_dir: Path) -> int:
    """How many `<2 hex>/<16 hex>.log` files are under `ledgers_dir` (by name only)."""
    count = 0
    try:
        folders = list(os.scandir(ledgers_dir))
    except FileNotFoundError:
        return 0
    for folder in folders:
        if not folder.is_dir(follow_symlinks=False):
            continue
        with os.scandir(folder.path) as files:
            count += sum(1 for file in files if file.name.endswith(".log"))
    return count


def _has_journal_segments(journal_dir: Path) -> bool:
    try:
        with os.scandir(journal_dir) as files:
            return any(file.name.endswith(".journal") for file in files)
    except FileNotFoundError:
        return False
