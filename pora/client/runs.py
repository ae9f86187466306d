"""ADD_RUN frames of `NodeClient.add_entries`: entries cut into runs that fit a
frame, and each run's response read as one outcome per entry."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from journal.errors import PoraError
from netio import frames as f
from netio.errors import ProtocolError
from netio.frames import Status
from netio.messages import AddRunResponse, ErrorResponse, ResponseMessage
from pora.client.remote_errors import clone_error, error_from_response

#: What an ADD_RUN frame's length field counts besides its key and its entries, and
#: what each entry adds to it besides its payload (its u32 size).
_RUN_FRAME_BASE: Final = f.LENGTH_MIN + f.ADD_RUN_REQUEST_FIXED.size
_RUN_BYTES_PER_ENTRY: Final = 4


def split_runs(
    entries: Sequence[tuple[int, bytes]], key_bytes: int, frame_bytes_max: int
) -> list[tuple[int, int]]:
    """`entries` cut into runs, as `(start, stop)` slices in the caller's order: each
    as long as it can be while its entry ids go up by one, it holds at most
    RUN_ENTRIES_MAX entries, and its ADD_RUN frame stays within `frame_bytes_max`.
    An entry too large for any frame is a run of its own (the node refuses it)."""
    budget = frame_bytes_max - _RUN_FRAME_BASE - key_bytes
    runs: list[tuple[int, int]] = []
    start = used = next_id = 0
    for index, (entry_id, payload) in enumerate(entries):
        cost = _RUN_BYTES_PER_ENTRY + len(payload)
        if index and (
            entry_id != next_id or index - start == f.RUN_ENTRIES_MAX or used + cost > budget
        ):
            runs.append((start, index))
            start = index
            used = 0
        used += cost
        next_id = entry_id + 1
    if entries:
        runs.append((start, len(entries)))
    return runs


def run_outcomes(
    result: ResponseMessage | PoraError, ledger_id: int, first_entry_id: int, count: int
) -> list[PoraError | None]:
    """One outcome per entry of an ADD_RUN from its response: every entry fails with
    the error that refused the whole run (each with its own copy), or the entries the
    response lists fail alone, with the error their status stands for."""
    if isinstance(result, PoraError):
        return [result, *[clone_error(result) for _ in range(count - 1)]]
    if not (
        isinstance(result, AddRunResponse)
        and (result.ledger_id, result.first_entry_id, result.count)
        == (ledger_id, first_entry_id, count)
    ):
        raise ProtocolError(
            f"response {result.request_id} does not answer its ADD_RUN (entries "
            f"{first_entry_id}..{first_entry_id + count - 1} of ledger {ledger_id}): "
            f"{type(result).__name__}",
            status=Status.BAD_REQUEST,
            request_id=result.request_id,
        )
    outcomes: list[PoraError | None] = [None] * count
    for entry_id, status, message in result.failures:
        index = entry_id - first_entry_id
        if not 0 <= index < count:
            raise ProtocolError(
                f"response {result.request_id} to an ADD_RUN of entries {first_entry_id}.."
                f"{first_entry_id + count - 1} names entry {entry_id}, outside the run",
                status=Status.BAD_REQUEST,
                request_id=result.request_id,
            )
        outcomes[index] = error_from_response(
            ErrorResponse(result.request_id, f.Opcode.ADD_RUN, status, ledger_id, entry_id, message)
        )
    return outcomes


__all__ = ["run_outcomes", "split_runs"]
