"""Shared helpers of the network tests: a real node served on a real loopback port."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

import pora
from netio import codec
from netio.messages import ResponseMessage
from pora.node.node import Node
from pora.server.server import Server, ServerConfig


@contextlib.asynccontextmanager
async def serving(
    data_dir: Path, *, node_options: dict[str, Any] | None = None, **server_options: Any
) -> AsyncIterator[tuple[Node, Server, str]]:
    """A node on `data_dir` and a Server for it on 127.0.0.1, an ephemeral port."""
    async with (
        pora.open_node(data_dir, **(node_options or {})) as node,
        trio.open_nursery() as nursery,
    ):
        server = Server(node, ServerConfig(port=0, **server_options))
        host, port = await nursery.start(server.run)
        try:
            yield node, server, f"{host}:{port}"
        finally:
            await server.shutdown(drain_timeout_s=5.0)


async def raw_connection(address: str) -> trio.SocketStream:
    host, port = address.rsplit(":", 1)
    return await trio.open_tcp_stream(host, int(port))


async def receive_responses(
    stream: trio.abc.ReceiveStream, count: int, *, timeout_s: float = 10.0
) -> tuple[list[ResponseMessage], bool]:
    """Read until `count` responses came or the node closed the connection.

    Returns the responses and whether the connection was closed by the node.
    """
    decoder = codec.ResponseDecoder()
    responses: list[ResponseMessage] = []
    with trio.fail_after(timeout_s):
        while len(responses) < count:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                return responses, True
            if not data:
                return responses, True
            decoder.receive_data(bytes(data))
            responses.extend(decoder.next_responses())
    return responses, False


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made with the openssl CLI or the
    `cryptography` package, whichever is present (else the test is skipped)."""
    cert, key = directory / "node.crt", directory / "node.key"
    if shutil.which("openssl"):
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
                "-keyout",
                str(key),
                "-out",
                str(cert),
            ],
            check=True,
            capture_output=True,
        )
        return cert, key
    try:
        import datetime  # noqa: PLC0415 (only when openssl is absent)
        import ipaddress  # noqa: PLC0415

        from cryptography import x509  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415
        from cryptography.hazmat.primitives import hashes, serialization  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415
        from cryptography.hazmat.primitives.asymmetric import ec  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415
        from cryptography.x509.oid import NameOID  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415
    except ImportError:
        pytest.skip("neither the openssl CLI nor the cryptography package is present")
    private_key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(private_key, hashes.SHA256())
    )
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(
        private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert, key
