"""Throw-away PKI for a loopback control plane, made with the ``openssl`` CLI.

The ``openssl`` command is on every machine this project runs on, so using
it keeps the harness free of Python dependencies.  Leaf certificates use
P-256 keys (fast to generate); the service-account signing key is RSA
because every Kubernetes version accepts RS256 tokens.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

_EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]


@dataclass(frozen=True)
class Pki:
    """Paths of every file the control plane and the tests need."""

    dir: Path

    def path(self, name: str) -> Path:
        """Path of one PKI file by name (e.g. ``ca.crt``)."""
        return self.dir / name

    @property
    def ca_cert(self) -> Path:
        """CA that signs every certificate below; clients trust it."""
        return self.path("ca.crt")

    @property
    def ca_key(self) -> Path:
        """CA private key (controller-manager signs CSRs with it)."""
        return self.path("ca.key")

    @property
    def apiserver_cert(self) -> Path:
        """kube-apiserver serving certificate."""
        return self.path("apiserver.crt")

    @property
    def apiserver_key(self) -> Path:
        """kube-apiserver serving key."""
        return self.path("apiserver.key")

    @property
    def admin_cert(self) -> Path:
        """Client certificate of a ``system:masters`` member."""
        return self.path("admin.crt")

    @property
    def admin_key(self) -> Path:
        """Key of the admin client certificate."""
        return self.path("admin.key")

    @property
    def sa_key(self) -> Path:
        """Service-account token signing key (private)."""
        return self.path("sa.key")

    @property
    def sa_pub(self) -> Path:
        """Service-account token verification key (public)."""
        return self.path("sa.pub")

    @property
    def webhook_cert(self) -> Path:
        """Serving certificate for admission webhooks on 127.0.0.1."""
        return self.path("webhook.crt")

    @property
    def webhook_key(self) -> Path:
        """Key of the webhook serving certificate."""
        return self.path("webhook.key")


def _openssl(*args: str, cwd: Path) -> None:
    """Run openssl, surfacing its stderr if it fails."""
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")


def _make_ca(pki: Pki) -> None:
    _openssl(
        "req",
        "-x509",
        "-new",
        "-nodes",
        *_EC_KEY,
        "-keyout",
        str(pki.ca_key),
        "-out",
        str(pki.ca_cert),
        "-days",
        "3650",
        "-subj",
        "/CN=mcp-epoch-test-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        cwd=pki.dir,
    )


def _make_leaf(pki: Pki, name: str, subject: str, usage: str, sans: tuple[str, ...] = ()) -> None:
    """Issue ``<name>.crt``/``<name>.key`` signed by the CA.

    ``usage`` is ``serverAuth`` or ``clientAuth``; ``sans`` are openssl
    subjectAltName entries such as ``IP:127.0.0.1``.
    """
    ext = [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={usage}",
    ]
    if sans:
        ext.append("subjectAltName=" + ",".join(sans))
    extfile = pki.path(f"{name}.ext")
    extfile.write_text("\n".join(ext) + "\n", encoding="utf-8")
    csr = pki.path(f"{name}.csr")
    _openssl(
        "req",
        "-new",
        "-nodes",
        *_EC_KEY,
        "-keyout",
        str(pki.path(f"{name}.key")),
        "-out",
        str(csr),
        "-subj",
        subject,
        cwd=pki.dir,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(pki.ca_cert),
        "-CAkey",
        str(pki.ca_key),
        "-CAcreateserial",
        "-days",
        "825",
        "-sha256",
        "-extfile",
        str(extfile),
        "-out",
        str(pki.path(f"{name}.crt")),
        cwd=pki.dir,
    )
    csr.unlink()
    extfile.unlink()


def _make_sa_keys(pki: Pki) -> None:
    _openssl(
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        str(pki.sa_key),
        cwd=pki.dir,
    )
    _openssl("pkey", "-in", str(pki.sa_key), "-pubout", "-out", str(pki.sa_pub), cwd=pki.dir)


def generate(directory: Path, service_ip: str) -> Pki:
    """Create the whole PKI in ``directory`` and return its paths.

    ``service_ip`` is the first address of the service range: in-cluster
    clients reach the API server through it, so it belongs in the SANs.
    """
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)
    _make_ca(pki)
    _make_leaf(
        pki,
        "apiserver",
        "/CN=kube-apiserver",
        "serverAuth",
        (
            "IP:127.0.0.1",
            f"IP:{service_ip}",
            "DNS:localhost",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
        ),
    )
    _make_leaf(pki, "admin", "/O=system:masters/CN=mcp-epoch-admin", "clientAuth")
    _make_leaf(pki, "webhook", "/CN=127.0.0.1", "serverAuth", ("IP:127.0.0.1", "DNS:localhost"))
    # Client certificate the API server presents to aggregated API servers;
    # configuring it also gives controllers a requestheader CA to trust.
    _make_leaf(pki, "front-proxy-client", "/CN=front-proxy-client", "clientAuth")
    _make_sa_keys(pki)
    for key in directory.glob("*.key"):
        key.chmod(0o600)
    return pki
