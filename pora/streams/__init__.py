"""Streams: named, replicated logs made of ledgers (docs/streams.md).

A stream is a document in the metadata store (space "streams") listing its segments,
each a ledger, in order. `position.py` and `document.py` hold the decisions (no I/O);
`stream.py`, `writer.py` and `reader.py` do the I/O around them.
"""
