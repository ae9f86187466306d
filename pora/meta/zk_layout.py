"""Where the ZooKeeper metadata store keeps what (docs/metadata.md, "ZooKeeper
layout"), and how a `zk://` URL names the servers and the chroot."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, unquote

from pora.meta.documents import znode_name
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


ZK_URL_HINT = "use zk://host:port,host:port/chroot, an IPv6 address in brackets: zk://[::1]:2181/x"


def parse_zk_url(url: str) -> tuple[str, str]:
    """`zk://h1:p1,h2:p2/chroot` -> ("h1:p1,h2:p2", "/chroot"); no chroot -> "/".
    MetadataUnavailable for a host list the ZooKeeper client could not parse (it
    would raise a bare ValueError deep in its connection setup)."""
    hosts, _, chroot = url.removeprefix("zk://").partition("/")
    if not hosts:
        raise MetadataUnavailable(url, "no ZooKeeper servers in the URL", ZK_URL_HINT)
    for server in hosts.split(","):
        problem = _server_problem(server)
        if problem is not None:
            raise MetadataUnavailable(url, f"server {server!r}: {problem}", ZK_URL_HINT)
    return hosts, "/" + chroot.strip("/")


def _server_problem(server: str) -> str | None:
    """What is wrong with one `host[:port]` of a zk:// URL, or None."""
    if server.startswith("["):
        host, closed, rest = server[1:].partition("]")
        if not closed:
            return "an IPv6 address needs its closing bracket"
        if rest and not rest.startswith(":"):
            return "only ':port' may follow an IPv6 address's brackets"
        port = rest[1:] if rest else None
    else:
        if server.count(":") > 1:
            return "an IPv6 address goes in brackets"
        host, colon, port_text = server.partition(":")
        port = port_text if colon else None
    if not host:
        return "no host"
    if port is not None and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        return f"the port {port!r} is not a number in 1..65535"
    return None


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
    def documents(self) -> str:
        """Made by the first document created (not at open: opening stays a read)."""
        return self._under("documents")

    def document_space(self, space: str) -> str:
        return f"{self.documents}/{znode_name(space)}"

    def document(self, space: str, name: str) -> str:
        return f"{self.document_space(space)}/{znode_name(name)}"

    @property
    def cluster(self) -> str:
        """The cluster id, made when the store is set up (not at open: a store opened
        by a client is not set up by that)."""
        return self._under("cluster")

    @property
    def locks(self) -> str:
        """Made by the first lock taken; its children are ephemeral."""
        return self._under("locks")

    def lock(self, name: str) -> str:
        return f"{self.locks}/{znode_name(name)}"

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
