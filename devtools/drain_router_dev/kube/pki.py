"""The test cluster's certificates and keys, made with the ``openssl`` command line.

One CA signs every serving and client certificate; the API server tells clients apart by the
certificate's subject (CN is the user, O the groups), so each component gets the identity the real
cluster gives it and RBAC and Node authorization judge it as they would there. A separate key pair
signs service-account tokens.
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

DAYS = "30"


@dataclasses.dataclass(frozen=True)
class Identity:
    """A client certificate's subject: ``user`` and the ``groups`` it belongs to."""

    name: str
    user: str
    groups: tuple[str, ...] = ()

    @property
    def subject(self) -> str:
        return "".join(f"/O={group}" for group in self.groups) + f"/CN={self.user}"


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {result.stderr.strip()}")


class Pki:
    """The files under ``root``: ``ca.crt``, ``<name>.crt``/``<name>.key`` pairs, ``sa.key``/``sa.pub``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def ca(self) -> Path:
        return self.root / "ca.crt"

    def cert(self, name: str) -> Path:
        return self.root / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.root / f"{name}.key"

    def create(self, *, server_names: list[str], server_ips: list[str], clients: list[Identity]) -> None:
        """The CA, the API server's serving pair, one pair per client, the service-account keys."""
        self.root.mkdir(parents=True, exist_ok=True)
        _openssl("genrsa", "-out", "ca.key", "2048", cwd=self.root)
        _openssl(
            "req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=drain-router-test-ca",
            "-days", DAYS, "-out", "ca.crt", cwd=self.root,
        )  # fmt: skip
        alt = ",".join([*(f"DNS:{n}" for n in server_names), *(f"IP:{ip}" for ip in server_ips)])
        self._signed("apiserver", "/CN=kube-apiserver", extensions=(
            f"subjectAltName={alt}\nextendedKeyUsage=serverAuth\n"
        ))  # fmt: skip
        for client in clients:
            self._signed(client.name, client.subject, extensions="extendedKeyUsage=clientAuth\n")
        _openssl("genrsa", "-out", "sa.key", "2048", cwd=self.root)
        _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=self.root)

    def _signed(self, name: str, subject: str, *, extensions: str) -> None:
        ext = self.root / f"{name}.ext"
        ext.write_text("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n" + extensions)
        _openssl("genrsa", "-out", f"{name}.key", "2048", cwd=self.root)
        _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=self.root)
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", DAYS, "-extfile", ext.name, "-out", f"{name}.crt", cwd=self.root,
        )  # fmt: skip
