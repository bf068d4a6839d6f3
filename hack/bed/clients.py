"""The bed's own calls to what it runs: the API server as its admin (HTTPS with the admin cert, the
kubernetes client, kubectl) and the components' health endpoints."""

from __future__ import annotations

import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from hack.bed import network, paths, pki


def api_get(path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(
            network.APISERVER_URL + path, context=pki.admin_ssl_context(), timeout=timeout
        ) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return 200 <= r.status < 300
    except (urllib.error.URLError, OSError):
        return False


def healthz(port: int) -> bool:
    """A control-plane component's /healthz on its secure port (self-signed: not verified)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(f"https://{network.HOST}:{port}/healthz", context=ctx, timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def core_api():
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(str(paths.KUBECONFIG)))


def kubectl(bins: Path, *args: str, stdin: str | None = None, check: bool = True) -> str:
    r = subprocess.run(
        [str(bins / "kubectl"), f"--kubeconfig={paths.KUBECONFIG}", *args],
        input=stdin,
        capture_output=True,
        text=True,
    )
    if check and r.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout
