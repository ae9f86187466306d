"""The checks `Client` runs on what an application passes in, before anything is
stored or sent: each bad value gets an `InvalidArgument` (a ValueError) or an
`InvalidArgumentType` (a TypeError) naming the argument and what it accepts.

Pure (no I/O): a quorum that is not an int would otherwise reach the ledger record,
whose JSON keeps `2.5` while the writer stripes over `range(3)`; a ledger id past
what any store holds would reach SQLite as an OverflowError.
"""

from __future__ import annotations

from ledger.errors import InvalidArgument, InvalidArgumentType

#: ids are signed 64-bit integers on the wire, in SQLite and in the znode names
LEDGER_ID_MAX = 2**63 - 1


def is_int(value: object) -> bool:
    """An int and not a bool (True is an int to Python, never a quorum or an id)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_quorums(
    ensemble_size: object, write_quorum: object, ack_quorum: object
) -> tuple[int, int, int]:
    """(E, Qw, Qa) when each is an int and E >= Qw >= Qa >= 1; the defaults (None)
    resolved: Qw = E, Qa = Qw."""
    if not is_int(ensemble_size):
        raise _not_int("ensemble_size", ensemble_size)
    write_quorum = ensemble_size if write_quorum is None else write_quorum
    if not is_int(write_quorum):
        raise _not_int("write_quorum", write_quorum)
    ack_quorum = write_quorum if ack_quorum is None else ack_quorum
    if not is_int(ack_quorum):
        raise _not_int("ack_quorum", ack_quorum)
    assert isinstance(ensemble_size, int)
    assert isinstance(write_quorum, int)
    assert isinstance(ack_quorum, int)
    if not ensemble_size >= write_quorum >= ack_quorum >= 1:
        raise InvalidArgument(
            f"quorums ensemble_size={ensemble_size} write_quorum={write_quorum} "
            f"ack_quorum={ack_quorum} break E >= Qw >= Qa >= 1: ask for an ack quorum no "
            "larger than the write quorum, and a write quorum no larger than the ensemble"
        )
    return ensemble_size, write_quorum, ack_quorum


def _not_int(name: str, value: object) -> InvalidArgumentType:
    return InvalidArgumentType(
        f"{name} must be an int (not a bool or a float), got {value!r} "
        f"of type {type(value).__name__}"
    )


def ledger_id_in_range(ledger_id: object) -> bool:
    """Whether `ledger_id` is an id a ledger may have, [0, 2**63); InvalidArgumentType
    when it is not an int at all."""
    if not is_int(ledger_id):
        raise InvalidArgumentType(
            f"ledger_id must be an int, got {ledger_id!r} of type {type(ledger_id).__name__}"
        )
    assert isinstance(ledger_id, int)
    return 0 <= ledger_id <= LEDGER_ID_MAX


def check_password(password: object) -> str | bytes:
    """A ledger password is a str (UTF-8) or bytes; "" is the empty password. None is
    refused, as BookKeeper's clients refuse a null password: "no password" is said
    with ""."""
    if isinstance(password, str | bytes):
        return password
    raise InvalidArgumentType(
        f"password must be a str or bytes (use '' for a ledger without one), got "
        f"{type(password).__name__}"
    )


def check_url(url: object) -> str:
    """A metadata store URL is a str (`sqlite:...` or `zk://...`)."""
    if isinstance(url, str):
        return url
    raise InvalidArgumentType(
        f"url must be a str naming the metadata store (sqlite:///abs/path.db, "
        f"sqlite:relative/path.db or zk://host:port,.../chroot), got {url!r} of type "
        f"{type(url).__name__}"
    )
