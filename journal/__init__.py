"""The write-ahead log: record format, segments, the group-commit task, replay, trimming."""

from journal.errors import JournalCorruption, JournalError, JournalFormatError, PoraError
from journal.format import CLOSE_KEEP_ALL, FORMAT_VERSION, RecordFlag, RecordKind
from journal.request import Request

__all__ = [
    "CLOSE_KEEP_ALL",
    "FORMAT_VERSION",
    "JournalCorruption",
    "JournalError",
    "JournalFormatError",
    "PoraError",
    "RecordFlag",
    "RecordKind",
    "Request",
]
