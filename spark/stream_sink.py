"""`df.writeStream.format("pora")...start("out")` (docs/spark.md, "Streaming
sink"): each micro-batch committed once, with the query's id as the commit's app id
and the batch id as its version, so a batch replayed after a driver crash changes
nothing.

The tasks of a batch cannot be handed a transaction id (the writer is pickled to them
once, when the query starts), but Spark sets local properties on the jobs of a
micro-batch that reach each task's context: `sql.streaming.queryId` (the query's id,
kept in its checkpoint, the same across restarts) and `streaming.sql.batchId`. Every
task of a batch derives one transaction id from (stream, query id, batch id) and
begins or joins it (`stream.begin(txn_id)`), and reports its segment with the query
id; the driver's `commit(messages, batchId)` (a fresh writer in a separate Python
worker) derives the same id and commits with `only=` the reported segments. A replay
of a committed batch begins a new transaction under the same id, whose commit finds
the version recorded and deletes its ledgers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from pora import TransactionAborted
from spark.blocking import blocking_client
from spark.schema import record_schema
from spark.task_writes import (
    SegmentWritten,
    local_property,
    open_or_create,
    task_identity,
    write_segment,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from spark.options import PoraOptions

#: the local properties Spark's micro-batch execution sets on a batch's jobs
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


class StreamingPropertiesMissing(RuntimeError):
    """A task of the Pora streaming sink without the query's local properties."""


def batch_transaction_id(stream: str, query_id: str, batch_id: int) -> str:
    """The transaction every task of a micro-batch begins or joins (32 hex digits)."""
    return hashlib.sha256(f"{stream}\0{query_id}\0{batch_id}".encode()).hexdigest()[:32]


class PoraStreamWriter(DataSourceStreamArrowWriter):
    """Constructed when the query starts (then pickled to its tasks) and again for
    each batch's commit or abort: both check the stream's schema."""

    def __init__(self, options: PoraOptions, schema: Any, overwrite: bool) -> None:
        if overwrite:
            raise ValueError(
                "the Pora streaming sink appends (outputMode append): each micro-batch "
                "adds its rows; complete mode would replace the stream every batch"
            )
        self.options = options
        with blocking_client(options.metadata) as pora:
            stream = open_or_create(pora, options)
            record_schema(pora, stream, schema, options.merge_schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        query_id = local_property(QUERY_ID_PROPERTY)
        batch = local_property(BATCH_ID_PROPERTY)
        if query_id is None or batch is None:
            raise StreamingPropertiesMissing(
                f"the Pora streaming sink's task has no {QUERY_ID_PROPERTY} and "
                f"{BATCH_ID_PROPERTY} local properties: run it from a Structured "
                "Streaming query (micro-batch trigger)"
            )
        txn_id = batch_transaction_id(self.options.stream, query_id, int(batch))
        _, partition, attempt = task_identity()
        tags = {"query": query_id, "batch": batch, "partition": str(partition)}
        tags["attempt"] = str(attempt)
        with blocking_client(self.options.metadata) as pora:
            stream = pora.call(pora.client.open_stream, self.options.stream)
            txn = stream.begin(txn_id)
            pora.call(txn.begin)  # the batch's: begun by the first task, joined after
            written = write_segment(pora, txn, iterator, self.options, tags)
        return written.message(txn_id, partition, attempt, query_id)

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803 (Spark's)
        """The batch's reported segments visible with one compare-and-set recording
        (query id, batch id); nothing when that version is recorded already."""
        reported = [m for m in messages if isinstance(m, SegmentWritten)]
        if not reported:
            return  # no task reported: nothing was written
        query_id = reported[0].query_id
        assert query_id is not None
        only = [m.ledger_id for m in reported if m.ledger_id is not None]
        txn_id = batch_transaction_id(self.options.stream, query_id, batchId)
        with blocking_client(self.options.metadata) as pora:
            stream = pora.call(pora.client.open_stream, self.options.stream)
            txn = stream.begin(txn_id)
            # joins the batch's transaction (a replayed commit begins an empty one,
            # which the commit finds applied already and removes)
            pora.call(txn.begin)
            pora.call(partial(txn.commit, app_id=query_id, version=batchId, only=only))

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """The batch's transaction aborted (found through a reported message: with
        none, it stays pending until `collect_abandoned_transactions`)."""
        reported = [m for m in messages if isinstance(m, SegmentWritten)]
        if not reported:
            return
        with blocking_client(self.options.metadata) as pora:
            stream = pora.call(pora.client.open_stream, self.options.stream)
            try:
                txn = pora.call(stream.resume, reported[0].txn_id)
            except TransactionAborted:
                return
            pora.call(txn.abort)
