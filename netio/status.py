"""The one table between the engine's errors and the wire's status codes.

The server answers an engine error with the status code that names it
(`status_of`); the client raises the error type a status code stands for
(`error_type_of`). Both directions come from `ERROR_TYPE_BY_STATUS`, so a status
added to the protocol is added here once. This module may import the error modules
of `journal` and `ledger`, and nothing else of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from journal.errors import PoraError
from ledger.errors import (
    EntryConflict,
    EntryTooLarge,
    InvalidArgument,
    LedgerClosed,
    LedgerFenced,
    NodeClosed,
    NodeReadOnly,
    NoSuchEntry,
    NoSuchLedger,
    StorageCorruption,
    Unauthorized,
)
from netio.errors import NodeOverloaded, ProtocolError, RemoteError
from netio.frames import Status

#: The error type each failure status stands for (OK stands for none).
ERROR_TYPE_BY_STATUS: Final[Mapping[int, type[PoraError]]] = MappingProxyType(
    {
        Status.NO_SUCH_LEDGER: NoSuchLedger,
        Status.NO_SUCH_ENTRY: NoSuchEntry,
        Status.FENCED: LedgerFenced,
        Status.CLOSED: LedgerClosed,
        Status.BAD_REQUEST: ProtocolError,
        Status.UNAUTHORIZED: Unauthorized,
        Status.TOO_LARGE: EntryTooLarge,
        Status.READ_ONLY: NodeReadOnly,
        Status.OVERLOADED: NodeOverloaded,
        Status.INTERNAL_ERROR: RemoteError,
        Status.ENTRY_CONFLICT: EntryConflict,
        Status.INVALID_ARGUMENT: InvalidArgument,
        Status.SHUTTING_DOWN: NodeClosed,
        Status.CORRUPT: StorageCorruption,
    }
)

#: The inverse: the status code of each error type in the table.
STATUS_BY_ERROR_TYPE: Final[Mapping[type[BaseException], Status]] = MappingProxyType(
    {error_type: Status(status) for status, error_type in ERROR_TYPE_BY_STATUS.items()}
)
# one type per status and one status per type: the two directions agree
assert len(STATUS_BY_ERROR_TYPE) == len(ERROR_TYPE_BY_STATUS)
assert set(ERROR_TYPE_BY_STATUS) == set(Status) - {Status.OK}


def status_of(error: BaseException) -> Status:
    """The status code that tells a client which error happened: that of the error's
    most specific type in the table; INTERNAL_ERROR for an error the table lacks
    (a bug on the node)."""
    for error_type in type(error).__mro__:
        status = STATUS_BY_ERROR_TYPE.get(error_type)
        if status is not None:
            return status
    return Status.INTERNAL_ERROR


def error_type_of(status: int) -> type[PoraError]:
    """The error type a failure status stands for; RemoteError for a status this
    side does not know (a newer node's)."""
    return ERROR_TYPE_BY_STATUS.get(status, RemoteError)
