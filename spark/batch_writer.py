"""`df.write.format("pora")` (docs/spark.md, "Batch writes"): one stream transaction
per job, made visible by the driver's commit with one compare-and-set.

Where each part runs (pyspark 4's data source API): the writer is constructed in a
Python worker on the driver when the write is planned (here: the stream opened or
created, the schema checked or recorded, the transaction begun under the job's id),
then pickled to every task (`write`: one segment per task attempt, tagged with the
job, partition and attempt) and, separately, to the driver's commit worker
(`commit` / `abort`), which has only the pickled fields and the tasks' messages.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from pora import TransactionAborted
from spark.blocking import blocking_client
from spark.schema import record_schema
from spark.task_writes import (
    SegmentWritten,
    open_or_create,
    task_identity,
    write_segment,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from spark.options import PoraOptions


class PoraBatchWriter(DataSourceArrowWriter):
    """A batch write's one transaction: begun here, on the driver."""

    def __init__(self, options: PoraOptions, schema: Any, overwrite: bool) -> None:
        self.options = options
        self.overwrite = overwrite
        #: the job's id: its transaction's id and its commit key
        self.job = uuid.uuid4().hex
        with blocking_client(options.metadata) as pora:
            stream = open_or_create(pora, options)
            record_schema(pora, stream, schema, options.merge_schema)
            pora.call(stream.begin(self.job).begin)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        """This task's rows in a segment of the job's transaction."""
        _, partition, attempt = task_identity()
        tags = {"job": self.job, "partition": str(partition), "attempt": str(attempt)}
        with blocking_client(self.options.metadata) as pora:
            stream = pora.call(pora.client.open_stream, self.options.stream)
            txn = pora.call(stream.resume, self.job)
            written = write_segment(pora, txn, iterator, self.options, tags)
        return written.message(self.job, partition, attempt)

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        """The reported segments made visible with one compare-and-set (the stream's
        earlier contents removed in it for an overwrite); every other segment of the
        transaction (a failed or losing attempt's) dropped in it and deleted. Keyed
        by the job: a commit retried after a lost reply applies once."""
        only = [
            message.ledger_id
            for message in messages
            if isinstance(message, SegmentWritten) and message.ledger_id is not None
        ]
        with blocking_client(self.options.metadata) as pora:
            stream = pora.call(pora.client.open_stream, self.options.stream)
            txn = stream.begin(self.job)
            commit = partial(txn.commit, key=self.job, only=only, replace=self.overwrite)
            pora.call(commit)

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        """The job's transaction aborted: none of its rows visible, its ledgers deleted
        (those a losing attempt opens later are refused: the transaction is gone)."""
        with blocking_client(self.options.metadata) as pora:
            stream = pora.call(pora.client.open_stream, self.options.stream)
            try:
                txn = pora.call(stream.resume, self.job)
            except TransactionAborted:
                return  # gone already: aborted, collected, or committed by a retry
            pora.call(txn.abort)
