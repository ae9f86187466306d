"""An entry is tied to its ledger's incarnation: the record's random token is covered
by every entry's crc, so entries an earlier ledger of the same id left on the nodes
(a metadata store lost, ids handed out again from 0) never pass as this ledger's."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from replication_support import local_cluster
from writer_support import client_on

import pora
from netio.security import master_key_from_password
from pora.client.replication.core.entry_format import (
    ENTRY_FORMAT,
    ENTRY_FORMAT_UNTOKENED,
    decode_entry,
    encode_entry,
)
from pora.client.replication.core.ledger_records import new_ledger
from pora.client.replication.errors import EntryDamaged
from pora.meta.records import LedgerMetadata

OLD_TOKEN, NEW_TOKEN = 0x0123_4567_89AB_CDEF, 0xFEDC_BA98_7654_3210


def test_the_crc_covers_the_token_and_untokened_records_keep_format_1() -> None:
    tokened = encode_entry(1, 5, 3, b"abc", token=NEW_TOKEN)
    assert tokened[0] == ENTRY_FORMAT
    assert decode_entry(1, 5, tokened, token=NEW_TOKEN).payload == b"abc"
    with pytest.raises(EntryDamaged, match="an earlier ledger's of the same id"):
        decode_entry(1, 5, encode_entry(1, 5, 3, b"abc", token=OLD_TOKEN), token=NEW_TOKEN)
    untokened = encode_entry(1, 5, 3, b"abc")
    assert untokened[0] == ENTRY_FORMAT_UNTOKENED
    assert decode_entry(1, 5, untokened).payload == b"abc"  # a record without a token
    with pytest.raises(EntryDamaged, match="format 1, expected 2"):
        decode_entry(1, 5, untokened, token=NEW_TOKEN)
    with pytest.raises(EntryDamaged, match="format 2, expected 1"):
        decode_entry(1, 5, tokened)
    with pytest.raises(ValueError, match="not a u64"):
        encode_entry(1, 5, 3, b"abc", token=1 << 64)


def test_a_record_written_before_tokens_reads_as_without_one() -> None:
    record = LedgerMetadata.decode(
        b'{"format_version":1,"ledger_id":1,"ensemble_size":1,"write_quorum":1,'
        b'"ack_quorum":1,"state":"OPEN","last_entry_id":-1,"length":0,'
        b'"ensembles":[[0,[["a:1","i"]]]],"password_digest":"","created_ms":0,"custom":{}}'
    )
    assert record.token == 0  # a record written before tokens reads as "none"
    assert b'"token"' not in record.encode()


async def test_a_new_ledger_s_recovery_never_takes_an_earlier_ledger_s_entries(
    tmp_path: Path,
) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster:
        async with client_on(cluster) as old_client:
            old = await old_client.create_ledger(3, 3, 2, password="pw")
            for k in range(50):
                await old.append(b"OLD-ledger-%d" % k)
            members = old.metadata.ensembles[-1].members
            ledger_id = old.ledger_id
            old_token = old.metadata.token
            assert old_token != 0
        # the old writer is gone with its ledger open; the metadata store is lost and
        # a new ledger is given the same id, on the same nodes, with the same password
        lost = await cluster.store.read_ledger(ledger_id)
        await cluster.store.delete_ledger(ledger_id, lost.version)
        new_token = random.Random(11).getrandbits(64)
        assert new_token != old_token
        await cluster.store.create_ledger(
            new_ledger(ledger_id, 3, 2, members, master_key_from_password("pw"), 0, token=new_token)
        )
        async with client_on(cluster) as client:
            try:
                reader = await client.open_ledger(ledger_id, password="pw")
            except pora.RecoveryFailed as failed:
                # the old entries are damaged copies here: never present, reported
                assert "damaged copy" in str(failed) or "crc" in str(failed), failed
            else:
                assert reader.last_entry_id == -1
                assert reader.metadata.length == 0
