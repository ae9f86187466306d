"""Streams: named, replicated logs made of ledgers (docs/streams.md).

A stream is a document in the metadata store (space "streams", older segments in
pages in space "stream-pages") listing its segments, each a ledger, in order.
`position.py` and `document.py` hold the decisions (no I/O); `records.py` reads and
compare-and-sets the documents; `stream.py` (the client's calls and `Stream`),
`writer.py` (the live writer) and `reader.py` (read, subscribe) do the I/O around them.
Transactions: `transaction_fields.py` and `transaction_changes.py` decide,
`transaction.py` does the I/O.
"""
