"""The bed's certificates (openssl, under .state/bed/pki/): its CA, the API server's serving cert, the
admin and operator client certs, the service-account key; and the kubeconfigs made from them."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
from pathlib import Path

from hack.bed import network, paths
from hack.bed.log import log

OPERATOR_USER = "rltune-operator"


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def ensure() -> None:
    if (paths.PKI / "admin.crt").exists() and (paths.PKI / "sa.pub").exists():
        return
    paths.PKI.mkdir(parents=True, exist_ok=True)
    log("generating CA, serving cert, admin client cert, service-account key (openssl)")
    d = str(paths.PKI)
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        f"{d}/ca.key",
        "-out",
        f"{d}/ca.crt",
        "-days",
        "3650",
        "-subj",
        "/CN=rltune-testbed-ca",
    )
    sans = (
        "subjectAltName=DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,"
        "IP:127.0.0.1,IP:10.96.0.1"
    )
    for name, subj, ext in [
        ("apiserver", "/CN=kube-apiserver", f"{sans}\nextendedKeyUsage=serverAuth,clientAuth\n"),
        ("admin", "/O=system:masters/CN=rltune-admin", "extendedKeyUsage=clientAuth\n"),
    ]:
        (paths.PKI / f"{name}.ext").write_text("keyUsage=critical,digitalSignature,keyEncipherment\n" + ext)
        openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{d}/{name}.key",
            "-out",
            f"{d}/{name}.csr",
            "-subj",
            subj,
        )
        openssl(
            "x509",
            "-req",
            "-in",
            f"{d}/{name}.csr",
            "-CA",
            f"{d}/ca.crt",
            "-CAkey",
            f"{d}/ca.key",
            "-CAcreateserial",
            "-out",
            f"{d}/{name}.crt",
            "-days",
            "3650",
            "-extfile",
            f"{d}/{name}.ext",
        )
    openssl("genrsa", "-out", f"{d}/sa.key", "2048")
    openssl("rsa", "-in", f"{d}/sa.key", "-pubout", "-out", f"{d}/sa.pub")
    for f in paths.PKI.iterdir():
        if f.suffix == ".key":
            f.chmod(0o600)


def write_kubeconfig() -> None:
    def b64(name: str) -> str:
        return base64.b64encode((paths.PKI / name).read_bytes()).decode()

    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [
            {
                "name": "rltune-bed",
                "cluster": {"server": network.APISERVER_URL, "certificate-authority-data": b64("ca.crt")},
            }
        ],
        "users": [
            {
                "name": "rltune-admin",
                "user": {"client-certificate-data": b64("admin.crt"), "client-key-data": b64("admin.key")},
            }
        ],
        "contexts": [
            {"name": "rltune-bed", "context": {"cluster": "rltune-bed", "user": "rltune-admin", "namespace": "default"}}
        ],
        "current-context": "rltune-bed",
    }
    tmp = paths.KUBECONFIG.with_suffix(".tmp")
    tmp.write_text(json.dumps(cfg, indent=1))  # JSON is YAML
    tmp.chmod(0o600)
    tmp.replace(paths.KUBECONFIG)


def operator_kubeconfig() -> Path:
    """A kubeconfig for an operator run on the bed as its own user (CN=rltune-operator, group
    system:masters: the same rights as the admin kubeconfig), whose every request the audit log
    records (audit_policy). Made on first use; the apiserver accepts any cert its CA signed."""
    if paths.OPERATOR_KUBECONFIG.exists():
        return paths.OPERATOR_KUBECONFIG
    d = str(paths.PKI)
    (paths.PKI / "operator.ext").write_text(
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n"
    )
    key, csr, crt = f"{d}/operator.key", f"{d}/operator.csr", f"{d}/operator.crt"
    subj = f"/O=system:masters/CN={OPERATOR_USER}"
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", subj)
    ca = ["-CA", f"{d}/ca.crt", "-CAkey", f"{d}/ca.key", "-CAcreateserial"]
    openssl("x509", "-req", "-in", csr, *ca, "-out", crt, "-days", "3650", "-extfile", f"{d}/operator.ext")
    (paths.PKI / "operator.key").chmod(0o600)
    cfg = json.loads(paths.KUBECONFIG.read_text())
    cfg["users"] = [
        {
            "name": OPERATOR_USER,
            "user": {
                "client-certificate-data": base64.b64encode((paths.PKI / "operator.crt").read_bytes()).decode(),
                "client-key-data": base64.b64encode((paths.PKI / "operator.key").read_bytes()).decode(),
            },
        }
    ]
    cfg["contexts"][0]["context"]["user"] = OPERATOR_USER
    tmp = paths.OPERATOR_KUBECONFIG.with_suffix(".tmp")
    tmp.write_text(json.dumps(cfg, indent=1))
    tmp.chmod(0o600)
    tmp.replace(paths.OPERATOR_KUBECONFIG)
    return paths.OPERATOR_KUBECONFIG


def admin_ssl_context() -> ssl.SSLContext:
    """TLS to the API server as the bed's admin (client cert), trusting the bed's CA."""
    ctx = ssl.create_default_context(cafile=str(paths.PKI / "ca.crt"))
    ctx.load_cert_chain(str(paths.PKI / "admin.crt"), str(paths.PKI / "admin.key"))
    return ctx
