"""The typed errors of streams; `pora` and `pora.errors` re-export them."""

from __future__ import annotations

from journal.errors import PoraError
from pora.client.replication.errors import DeleteFailed
from pora.streams.position import Position


class StreamError(PoraError):
    """Something about a named stream; `stream` names it."""

    def __init__(self, stream: str, message: str) -> None:
        self.stream = stream
        super().__init__(message)


class NoSuchStream(StreamError):
    def __init__(self, stream: str) -> None:
        super().__init__(
            stream,
            f"stream {stream!r} does not exist: create it (client.create_stream) or "
            "check the name (client.list_streams)",
        )


class StreamExists(StreamError):
    def __init__(self, stream: str) -> None:
        super().__init__(
            stream, f"stream {stream!r} already exists: open it (client.open_stream) instead"
        )


class StreamDeleting(StreamExists):
    """`create_stream` found the name held by a stream whose delete did not finish
    (it is marked deleting, gone for every client): call `delete_stream` again."""

    def __init__(self, stream: str) -> None:
        StreamError.__init__(
            self,
            stream,
            f"stream {stream!r} is being deleted: an earlier delete_stream did not finish "
            "(it could not fence a writer's ledger); call client.delete_stream "
            f"({stream!r}) again, then create it",
        )


class StreamDeleteFailed(DeleteFailed):
    """`delete_stream` could not fence the ledger of a segment a writer may still
    append to (R26): the stream stays marked deleting (gone for every client) and a
    retry of `delete_stream` finishes it. `stream`, `segment` (which segment, in
    words), `ledger_id` and `what` say which and why."""

    def __init__(self, stream: str, segment: str, failed: DeleteFailed) -> None:
        self.stream = stream
        self.segment = segment
        self.ledger_id = failed.ledger_id
        self.what = failed.what
        PoraError.__init__(
            self,
            f"delete of stream {stream!r} could not fence the writer of its {segment} "
            f"(ledger {failed.ledger_id}): {failed.what}; the stream stays marked deleting "
            "(gone for every client, but that writer may still have appends acknowledged): "
            "bring those nodes back (or wait for them) and call delete_stream again",
        )


class StreamSealed(StreamError):
    """The stream was sealed: no writer may append to it again (reading goes on)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream, f"stream {stream!r} is sealed: it takes no more appends")


class WriterFenced(StreamError):
    """A newer writer took over the stream: none of this writer's later appends is
    acknowledged (what it acknowledged before stays in the stream)."""

    def __init__(self, stream: str, epoch: int, current_epoch: int) -> None:
        self.epoch = epoch
        self.current_epoch = current_epoch
        super().__init__(
            stream,
            f"the writer of stream {stream!r} (epoch {epoch}) was fenced by a newer writer "
            f"(epoch {current_epoch}): its appends are not acknowledged from here on; "
            "open a new writer to go on writing",
        )


class EntriesTruncated(StreamError):
    """What a reader asked for was removed by truncation or retention: `first_held`
    names the first position the stream still holds (never a silent skip: read from
    it to go on, knowing what was lost)."""

    def __init__(self, stream: str, requested: object, first_held: object) -> None:
        self.requested = requested
        self.first_held = first_held
        super().__init__(
            stream,
            f"stream {stream!r}: position {requested} was removed by truncation or "
            f"retention; the first position still held is {first_held} (read from it "
            "to go on)",
        )


class EntriesLost(StreamError):
    """A reader reached a LOST segment: its ledger was deleted outside the stream (an
    operator's `delete_ledger`), so its entries are gone. `segment` is its seq and
    `resume_at` the first position after it (never a silent skip: read from it to go
    on, knowing what was lost)."""

    def __init__(self, stream: str, segment: int, ledger_id: int, resume_at: Position) -> None:
        self.segment = segment
        self.ledger_id = ledger_id
        self.resume_at = resume_at
        super().__init__(
            stream,
            f"stream {stream!r}: segment {segment} is LOST (its ledger {ledger_id} was "
            f"deleted outside the stream, and its entries with it); the first position "
            f"after it is {resume_at} (read from it to go on)",
        )


class NoSuchCursor(StreamError):
    def __init__(self, stream: str, cursor: str) -> None:
        self.cursor = cursor
        super().__init__(
            stream,
            f"stream {stream!r} has no cursor {cursor!r}: it was deleted; "
            "stream.cursor(name) creates it again",
        )


class TransactionAborted(StreamError):
    """The transaction is no longer pending: aborted, collected as abandoned, or
    skipped. Nothing of it is visible; its segments' ledgers are deleted."""

    def __init__(self, stream: str, txn_id: str, why: str = "was aborted") -> None:
        self.txn_id = txn_id
        super().__init__(
            stream,
            f"transaction {txn_id} of stream {stream!r} {why}: none of its entries is in the "
            "stream; begin a new transaction (stream.begin) to write them",
        )


class AttributesChanged(StreamError):
    """`Stream.set_attributes` found an attribute other than the caller expected
    (another writer changed it first): nothing was changed. `key`, `expected` and
    `current` (None: absent) say which; read the attributes again and decide."""

    def __init__(self, stream: str, key: str, expected: str | None, current: str | None) -> None:
        self.key = key
        self.expected = expected
        self.current = current
        super().__init__(
            stream,
            f"stream {stream!r}: attribute {key!r} is {_shown(current)}, "
            f"not {_shown(expected)} as expected: another writer "
            "changed it; read the attributes again (stream.attributes()) and decide",
        )


class WriterActive(StreamError):
    """A commit with `replace=True` found the live writer's OPEN segment: a replace
    removes every visible segment, and an open one cannot be removed. Close the
    stream's writer (leave its `open_writer()` block) and commit again."""

    def __init__(self, stream: str, seq: int) -> None:
        self.seq = seq
        super().__init__(
            stream,
            f"stream {stream!r}: its live writer holds segment {seq} OPEN, so a commit "
            "that replaces the stream's contents cannot remove it; close the writer "
            "(leave its open_writer() block) and commit again",
        )


def _shown(value: str | None) -> str:
    if value is None:
        return "absent"
    return repr(value if len(value) <= 80 else value[:77] + "...")
