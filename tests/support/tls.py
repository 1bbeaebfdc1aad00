"""A TLS certificate for the tests' fake HTTPS servers (Batch, ARM, the emulated storage): its
own CA, for one IP address, trusted by clients through REQUESTS_CA_BUNDLE."""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def self_signed(folder: Path, ip: str = "127.0.0.1", name: str = "test") -> tuple[Path, Path]:
    """Write ``<name>.pem`` (world-readable: servers may run as another user) and ``<name>.key``
    to ``folder``; returns their paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / f"{name}.pem", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    os.chmod(cert_path, 0o644)
    return cert_path, key_path


def serve_https(
    handler: type[BaseHTTPRequestHandler], folder: Path, name: str = "test"
) -> tuple[ThreadingHTTPServer, Path]:
    """``handler`` served over TLS on a free 127.0.0.1 port in a daemon thread; returns the
    server (``shutdown()`` it) and the certificate clients must trust."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    return server, serve_tls(server, folder, name)


def serve_tls(server: ThreadingHTTPServer, folder: Path, name: str = "test") -> Path:
    """Serve ``server`` (bound, not yet serving) over TLS in a daemon thread; returns the
    certificate, written to ``folder``, that its clients must trust."""
    cert_path, key_path = self_signed(folder, name=name)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    return cert_path
