"""Local HTTP fakes of cloud APIs for the drivers' tests.

Each fake keeps its resources in memory, records every request it receives (method, path,
query, headers, JSON body) so tests can assert the shapes a driver sends, and implements only the
endpoints our drivers call. :class:`FakeServer` runs an aiohttp app on a free port of 127.0.0.1,
over HTTPS when given a certificate (:func:`self_signed_cert`).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from aiohttp import web

from services.common import procs


@dataclass
class Recorded:
    """One request a fake received."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any = None


@dataclass
class FakeServer:
    """An aiohttp app on 127.0.0.1 that records requests; subclasses add routes."""

    certificate: tuple[Path, Path] | None = None  # (cert, key): serve HTTPS
    requests: list[Recorded] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.port = procs.free_port()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.certificate else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def routes(self) -> list[web.RouteDef]:
        raise NotImplementedError

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        body: Any = None
        if request.can_read_body:
            text = await request.text()
            try:
                body = json.loads(text)
            except ValueError:
                body = text
        self.requests.append(Recorded(request.method, request.path, dict(request.query),
                                      dict(request.headers), body))
        return await handler(request)

    def calls(self, method: str | None = None, path_contains: str = "") -> list[Recorded]:
        """The recorded requests with ``method`` whose path contains ``path_contains``."""
        return [r for r in self.requests if (method is None or r.method == method)
                and path_contains in r.path]

    async def __aenter__(self) -> Self:
        app = web.Application(middlewares=[self._record])
        app.add_routes(self.routes())
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        context = None
        if self.certificate:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(*self.certificate)
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=context).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost and its key, as PEM files: (cert, key).

    The certificate is its own CA: give its path to a client as the CA bundle.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hailstream test fake")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "fake.crt", directory / "fake.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path
