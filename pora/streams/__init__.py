"""Streams: named, replicated logs made of ledgers (docs/streams.md).

A stream is a document in the metadata store (space "streams", older segments in
pages in space "stream-pages") listing its segments, each a ledger, in order.
`position.py`, `document.py` and `retention.py` hold the decisions (no I/O);
`records.py` reads and compare-and-sets the documents; `stream.py` (the client's calls,
`Stream`, truncate and trim), `deletion.py` (`delete_stream`: mark, fence, delete),
`writer.py` (the live writer), `reader.py` (read, subscribe) and `cursors.py` (durable
reader positions, in space "stream-cursors") do the I/O around them.
Transactions: `transaction_fields.py` and `transaction_changes.py` decide,
`transaction.py` does the I/O.
"""
