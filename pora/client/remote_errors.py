"""A node's error responses as the engine's own exceptions, for the per-node client.

An error response names a status (the exception type), the node's message, and the
ledger and entry it is about; the client raises it as that type with that message,
so that a remote failure reads as a local one (`pora.NoSuchEntry`, ...).
"""

from __future__ import annotations

from journal.errors import PoraError
from ledger.errors import EntryTooLarge
from netio.errors import ProtocolError
from netio.messages import ErrorResponse
from netio.status import error_type_of


def error_from_response(response: ErrorResponse) -> PoraError:
    """The typed exception of an error response, carrying the node's own message.

    Built without calling the type's constructor: the node already wrote the
    message (what, where, what to do), and the constructors want arguments (a
    size limit, say) that only the node knows.
    """
    error_type = error_type_of(response.status)
    error = error_type.__new__(error_type)
    Exception.__init__(error, response.message)
    error.ledger_id = response.ledger_id  # type: ignore[attr-defined]
    error.entry_id = response.entry_id  # type: ignore[attr-defined]
    if isinstance(error, ProtocolError):
        error.status = response.status
        error.request_id = response.request_id
    if isinstance(error, EntryTooLarge):
        error.size = error.limit = -1  # not carried by the protocol
    return error


def clone_error(error: PoraError) -> PoraError:
    """A copy of `error` for another caller (or entry) to raise with a traceback of
    its own. Made without the constructor, as `error_from_response` makes errors:
    `copy.copy` would call it with the message alone, which most engine errors
    (EntryTooLarge, Unauthorized, ...) do not take."""
    clone = type(error).__new__(type(error))
    Exception.__init__(clone, *error.args)
    clone.__dict__.update(error.__dict__)
    return clone


__all__ = ["clone_error", "error_from_response"]
