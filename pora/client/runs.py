"""The outcomes of `NodeClient.add_entries`' ADD_RUN frames: each run's response read
as one outcome per entry."""

from __future__ import annotations

from journal.errors import PoraError
from netio import frames as f
from netio.errors import ProtocolError
from netio.frames import Status
from netio.messages import AddRunResponse, ErrorResponse, ResponseMessage
from pora.client.remote_errors import clone_error, error_from_response


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


__all__ = ["run_outcomes"]
