"""A pod's own network, for Python processes of pods the test bed runs as local processes.

On a real cluster a pod has its own network namespace: one interface carrying the pod IP and its
own loopback. Here every pod shares the host's network, so two pods that listen on the same fixed
port (a Ray head and a Ray worker: metrics 8080, dashboard agent 52365, ...) would collide, and
Ray's node-IP detection (the source address of a UDP socket "connected" to 8.8.8.8 or to the head)
would find the host's address or 127.0.0.1, the same for every pod. The pod runner puts this
directory on PYTHONPATH of containers whose image entry in hack/images.yaml says
`podNetwork: true` and sets RLTUNE_POD_IP; in those processes (and their Python children):

* a socket bound to the wildcard address (`0.0.0.0`, `''`, `::`) is bound to the pod IP instead:
  what "all interfaces" means inside a pod, and other pods' processes can bind the same port;
* a socket bound to 127.0.0.1:PORT whose port another pod's process holds (there is one loopback
  here, a pod has its own) is bound to an ephemeral loopback port instead, with a note on stderr;
* Ray's node-IP detection answers the pod IP (127.0.0.1 from the perspective of 127.0.0.1, as in
  a pod).

Sockets bound by native code (Ray's C++ GCS and raylet) are not covered: they listen on all
addresses, which only matters for fixed ports (the GCS port of two Ray heads at once).
The user's command is never changed.
"""

from __future__ import annotations

import errno
import importlib.abc
import importlib.machinery
import os
import socket
import sys

_POD_IP = os.environ.get("RLTUNE_POD_IP", "")
_TARGET = "ray._common.network_utils"


def _patch(module) -> None:
    real = module._node_ip_address_from_perspective

    def node_ip_address_from_perspective(address=None):
        if address:
            host = address.rsplit(":", 1)[0].strip("[]") if ":" in address else address
            if host in ("127.0.0.1", "localhost", "::1"):
                return real(address)
        return _POD_IP

    module._node_ip_address_from_perspective = node_ip_address_from_perspective


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


_WILDCARD = ("", "0.0.0.0", "::", "::0")
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_real_bind = socket.socket.bind


def _pod_bind(self, address):
    if isinstance(address, tuple) and len(address) >= 2 and self.family in (socket.AF_INET, socket.AF_INET6):
        host, port = address[0], address[1]
        if host in _WILDCARD:
            ip = _POD_IP if self.family == socket.AF_INET else "::ffff:" + _POD_IP
            return _real_bind(self, (ip, port, *address[2:]))
        if host in _LOOPBACK and port:
            try:
                return _real_bind(self, address)
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    raise
                print(
                    f"[test bed] {host}:{port} is held by another pod on this machine (pods share one "
                    "loopback here): bound an ephemeral loopback port instead",
                    file=sys.stderr,
                )
                return _real_bind(self, (host, 0, *address[2:]))
    return _real_bind(self, address)


if _POD_IP:
    socket.socket.bind = _pod_bind
    if _TARGET not in sys.modules:
        sys.meta_path.insert(0, _Finder())
