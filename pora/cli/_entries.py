"""Printing entries, shared by `pora ledger read` and `pora stream read | tail`: one
line per entry (its key, size and payload as hex), JSON lines with the payload in
base64, or the payloads' raw bytes back to back in a file."""

from __future__ import annotations

import base64
import sys
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from pora.cli._common import EXIT_REFUSED, CommandError, print_json_line


def print_entry(
    key: str,
    json_fields: Mapping[str, object],
    payload: bytes,
    *,
    as_json: bool,
    flush: bool = False,
) -> None:
    """`key`, size and hex payload tab-separated; or (`as_json`) a JSON line of
    `json_fields` with the size and the payload in base64. `flush` for output that
    follows live entries (`pora stream tail`), so that a pipe's reader sees each as it
    comes."""
    if as_json:
        line = {
            **json_fields,
            "size": len(payload),
            "payload_base64": base64.b64encode(payload).decode("ascii"),
        }
        print_json_line(line)
    else:
        print(f"{key}\t{len(payload)}\t{payload.hex()}")
    if flush:
        sys.stdout.flush()


def check_raw_target(path: Path, example_name: str) -> None:
    """Refuse a --raw FILE that cannot be written, before any work is done
    (`example_name`: a file name to suggest instead of a directory)."""
    if path.is_dir():
        raise CommandError(
            f"--raw {path} is a directory; give a file name to write the payloads to, "
            f"like {path / example_name}",
            EXIT_REFUSED,
        )
    if not path.parent.is_dir():
        raise CommandError(
            f"--raw {path}: the folder {path.parent} does not exist; create it first or "
            "choose another path",
            EXIT_REFUSED,
        )


class RawPayloads:
    """The payloads alone, back to back, into the file `target`; on a clean exit says
    how many entries and bytes of `what` ("ledger 7", "stream 'events'") it wrote."""

    def __init__(self, target: Path, what: str) -> None:
        self._target = target
        self._what = what
        self._out: BinaryIO | None = None
        self.entries = 0
        self.bytes = 0

    def __enter__(self) -> RawPayloads:
        try:
            self._out = open(self._target, "wb")
        except OSError as error:
            raise CommandError(
                f"cannot write --raw {self._target}: {error.strerror}; choose a path this "
                "user can write",
                EXIT_REFUSED,
            ) from None
        return self

    def write(self, payload: bytes) -> None:
        assert self._out is not None, "write inside the with block"
        self._out.write(payload)
        self.entries += 1
        self.bytes += len(payload)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._out is not None
        self._out.close()
        if kind is None:
            print(
                f"wrote {self.entries} entries ({self.bytes} bytes) of {self._what} "
                f"to {self._target}"
            )
