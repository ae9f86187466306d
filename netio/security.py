"""Master keys: what a writer proves it knows about a ledger.

A ledger's first add, fence or close fixes its master key on the node; later
ones must present the same key. The key is derived from the ledger password with
SHA-256 over a fixed domain prefix, so the password itself never travels, and a
key made for Pora cannot be confused with a hash made for another purpose. See
the Security section of docs/protocol.md for what this protects and what it
does not.
"""

from __future__ import annotations

import hashlib
from typing import Final

from journal.errors import MASTER_KEY_BYTES_MAX

__all__ = ["MASTER_KEY_BYTES_MAX", "MASTER_KEY_DOMAIN", "master_key_from_password"]

#: Prefix hashed before the password (domain separation). Never change: keys of
#: existing ledgers would stop matching.
MASTER_KEY_DOMAIN: Final = b"pora-ledger-master-key-v1\x00"


def master_key_from_password(password: str | bytes) -> bytes:
    """The 32-byte master key of a ledger password (str is encoded as UTF-8)."""
    if isinstance(password, str):
        password = password.encode("utf-8")
    return hashlib.sha256(MASTER_KEY_DOMAIN + password).digest()
