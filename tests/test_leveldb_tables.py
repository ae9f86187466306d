"""The table checker finds every damaged block of real LevelDB table files."""

from __future__ import annotations

from pathlib import Path

import plyvel
import pytest

from ledger.leveldb_tables import check_tables


def _tables(folder: Path) -> list[Path]:
    db = plyvel.DB(str(folder), create_if_missing=True, block_size=1024)
    try:
        with db.write_batch() as batch:
            for number in range(5000):  # compressible: snappy blocks, several of them
                batch.put(b"r" + number.to_bytes(8, "big"), b"value %d " % number * 4)
        db.compact_range()
    finally:
        db.close()
    return sorted(folder.glob("*.ldb"))


@pytest.mark.slow
def test_intact_tables_pass_and_every_flipped_block_byte_is_found(tmp_path: Path) -> None:
    tables = _tables(tmp_path / "index")
    assert tables
    assert check_tables(tmp_path / "index") == []
    table = tables[0]
    original = table.read_bytes()
    missed = []
    for offset in range(0, len(original) - 48, 97):  # the footer's padding is not checked
        damaged = bytearray(original)
        damaged[offset] ^= 0x20
        table.write_bytes(bytes(damaged))
        found = check_tables(tmp_path / "index")
        if not found:
            missed.append(offset)
        else:
            assert found[0].path == table
    table.write_bytes(original)
    assert missed == []
