"""Where the ZooKeeper metadata store keeps what (docs/metadata.md, "ZooKeeper
layout"), and how a `zk://` URL names the servers and the chroot."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, unquote

from pora.meta.errors import MetadataUnavailable

LAYOUT_VERSION = 1
#: ledgers per bucket znode: a bucket's children list stays small (BookKeeper's
#: hierarchical ledger managers split ids the same way)
LEDGERS_PER_BUCKET = 10_000
BUCKET_DIGITS = 15
LEDGER_ID_DIGITS = 19
#: a request's whole packet (path, data, headers) must fit ZooKeeper's
#: jute.maxbuffer (1 MiB - 1 by default): records keep 4 KiB of room for the rest
ZNODE_DATA_BYTES_MAX = 1024 * 1024 - 4096


def parse_zk_url(url: str) -> tuple[str, str]:
    """`zk://h1:p1,h2:p2/chroot` -> ("h1:p1,h2:p2", "/chroot"); no chroot -> "/"."""
    hosts, _, chroot = url.removeprefix("zk://").partition("/")
    if not hosts:
        raise MetadataUnavailable(
            url, "no ZooKeeper servers in the URL", "use zk://host:port,host:port/chroot"
        )
    return hosts, "/" + chroot.strip("/")


def bucket_of(ledger_id: int) -> int:
    return ledger_id // LEDGERS_PER_BUCKET


@dataclass(frozen=True)
class ZkPaths:
    root: str

    def _under(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}"

    @property
    def layout(self) -> str:
        return self._under("layout")

    @property
    def ledgers(self) -> str:
        return self._under("ledgers")

    @property
    def nodes(self) -> str:
        return self._under("nodes")

    @property
    def streams(self) -> str:
        return self._under("streams")

    @property
    def cluster(self) -> str:
        """The cluster id, made when the store is set up (not at open: a store opened
        by a client is not set up by that)."""
        return self._under("cluster")

    @property
    def marks(self) -> str:
        return self._under("marks")

    def mark(self, instance_id: str) -> str:
        return f"{self.marks}/{instance_id}"

    @property
    def id_counter(self) -> str:
        return self._under("idgen/ledger")

    def persistent(self) -> tuple[str, ...]:
        """The znodes every store creates at open (and never deletes)."""
        return (self.ledgers, self.nodes, self.streams, self._under("idgen"))

    def ledger(self, ledger_id: int) -> str:
        bucket = f"{bucket_of(ledger_id):0{BUCKET_DIGITS}d}"
        return f"{self.ledgers}/{bucket}/{ledger_id:0{LEDGER_ID_DIGITS}d}"

    def node(self, address: str) -> str:
        # '/' cannot appear in a znode name; ':' and '[]' (IPv6) can
        return f"{self.nodes}/{quote(address, safe=':[]')}"

    @staticmethod
    def address_of(name: str) -> str:
        return unquote(name)
