"""The one table between engine errors and status codes, read both ways."""

from __future__ import annotations

from pathlib import Path

from ledger.errors import NoSuchLedger, StorageCorruption
from netio.errors import RemoteError
from netio.frames import Status
from netio.status import ERROR_TYPE_BY_STATUS, error_type_of, status_of


def test_every_failure_status_and_its_error_type_map_to_each_other() -> None:
    for status in Status:
        if status is Status.OK:
            continue
        error_type = error_type_of(status)
        assert ERROR_TYPE_BY_STATUS[status] is error_type
        assert status_of(error_type.__new__(error_type)) is status


def test_a_subclass_takes_its_base_status_and_unknowns_are_internal() -> None:
    class Gone(NoSuchLedger):
        pass

    assert status_of(Gone(3)) is Status.NO_SUCH_LEDGER
    assert status_of(StorageCorruption(Path("x"), 1, "bad crc")) is Status.CORRUPT
    assert status_of(KeyError("a bug")) is Status.INTERNAL_ERROR
    assert error_type_of(200) is RemoteError  # a newer node's status
