"""What a kubelet gives a pod's container besides its process: volumes, identity and name resolution.

The pod runner (hack.bed.kubelet) runs trial and operator pods as local processes. Without this
module such a process would reach the API server with the bed's admin kubeconfig, and RBAC would
never be tried. With it, a container gets what a real kubelet gives it:

* its volumes, materialised under .state/bed/volumes/<pod uid>/<volume>: emptyDir, configMap,
  secret, downwardAPI, hostPath and projected (serviceAccountToken from the TokenRequest API, bound
  to the pod; the cluster CA from the kube-root-ca.crt ConfigMap; the namespace), bind-mounted at
  their mountPath in a private mount namespace (`unshare --mount`), read-only where asked. So the
  ServiceAccount admission plugin's `kube-api-access-*` volume puts a real, pod-bound token at
  /var/run/secrets/kubernetes.io/serviceaccount, exactly where in-cluster clients look;
* `KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT` pointing at the API server (the bed has no
  kube-proxy, so the `kubernetes` Service's ClusterIP is replaced by the API server's address);
* an /etc/hosts with the pod's own name and every Service's DNS names (`svc.ns.svc`,
  `svc.ns.svc.cluster.local`), resolved to the IP of a Running, Ready pod its selector matches (no
  kube-proxy, no CoreDNS, and the API server refuses EndpointSlices with the bed's loopback pod IPs:
  a name resolves to the endpoint directly, which is what a headless Service does anyway). The
  runner rewrites it in place every few seconds (`refresh_hosts`), so a Service whose pod became
  Running later resolves, as cluster DNS would; the same names go to the bed-wide
  .state/bed/hosts, the /etc/hosts of bed components that talk to pods (the KubeRay operator);
* emptyDir volumes with `medium: Memory` live under /dev/shm (memory-backed, as a kubelet's tmpfs);
* for images marked `privateTmp` in hack/images.yaml, a /tmp of the pod's own (a container has
  its own root filesystem; Ray keeps its session, sockets and logs under /tmp/ray).

Differences from a kubelet, on purpose: the container runs as the runner's user (root) whatever its
securityContext says; the root filesystem is not made read-only; projected tokens are refreshed at
80% of their lifetime by the runner's tick, not by a separate manager; and since the container shares
the host's filesystem, a volume whose mountPath would cover the repository or the bed's state (an
emptyDir at /tmp when the checkout is under /tmp) is not mounted (logged).
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from hack.bed.kubelet.status import pod_ready
from hack.bed.paths import REPO
from hack.bed.processes import in_private_mounts

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass
class Mount:
    source: Path
    target: str
    read_only: bool


@dataclass
class Sandbox:
    """The mounts and environment of one container."""

    mounts: list[Mount] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    token_files: list[tuple[Path, dict, float]] = field(default_factory=list)  # (file, source, refresh at)

    def mount_order(self) -> list[Mount]:
        """Parents before children; a mount that would hide another mount's source (an emptyDir at
        /tmp when the bed's state, where volumes live, is under /tmp) goes after that one."""

        def hides_a_source(m: Mount) -> bool:
            t = m.target.rstrip("/") + "/"
            return any(str(o.source).startswith(t) for o in self.mounts if o is not m)

        return sorted(self.mounts, key=lambda m: (hides_a_source(m), m.target.count("/")))

    def wrap(self, argv: list[str]) -> list[str]:
        """argv that sets up the mount namespace, then runs argv (exec, same pid as unshare)."""
        if not self.mounts:
            return argv
        lines = ["set -e"]
        for m in self.mount_order():
            tgt = _q(m.target)
            if m.source.is_dir():
                lines.append(f"mkdir -p {tgt}")
            else:
                lines.append(f"mkdir -p $(dirname {tgt}); [ -e {tgt} ] || : > {tgt}")
            lines.append(f"mount --bind {_q(str(m.source))} {tgt}")
            if m.read_only:
                lines.append(f"mount -o remount,bind,ro {tgt}")
        lines.append('exec "$@"')
        return in_private_mounts("\n".join(lines), "rltune-sandbox", *argv)


def _q(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


class PodSandboxes:
    """Builds Sandboxes. `request(method, path, body)` is the runner's admin call to the API server
    (the kubelet's own credentials: it reads ConfigMaps and Secrets and requests tokens for pods
    bound to it)."""

    def __init__(
        self,
        state: Path,
        request: Callable,
        apiserver_host: str,
        apiserver_port: int,
        log: Callable[[str], None] = print,
    ):
        self.root = state / "volumes"
        # memory-backed emptyDirs: a directory on the host's tmpfs, one per bed
        self.shm_root = Path("/dev/shm") / f"rltune-bed-{hashlib.sha1(str(state.resolve()).encode()).hexdigest()[:8]}"
        self.protected = [REPO, state.resolve()]  # the repository, the state
        self.request = request
        self.host, self.port = apiserver_host, apiserver_port
        self.log = log
        self.root.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ public
    def prepare(self, pod: dict, container: dict, entry: dict | None = None, snapshot: dict | None = None) -> Sandbox:
        """The sandbox of `container`; `entry` is its image's hack/images.yaml entry (privateTmp),
        `snapshot` a `hosts_snapshot()` to write /etc/hosts from (taken now when not given)."""
        sb = Sandbox(
            env={
                "KUBERNETES_SERVICE_HOST": self.host,
                "KUBERNETES_SERVICE_PORT": str(self.port),
                "KUBERNETES_SERVICE_PORT_HTTPS": str(self.port),
            }
        )
        mounts = container.get("volumeMounts") or []
        uid = pod["metadata"]["uid"]
        vols = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        base = self.root / uid
        for vm in mounts:
            vol = vols.get(vm["name"])
            if vol is None:
                raise SandboxError(f"volumeMount {vm['name']!r}: no such volume in the pod")
            src = base / vol["name"]
            if "hostPath" in vol:
                src = Path(vol["hostPath"]["path"])
            elif "emptyDir" in vol and (vol["emptyDir"] or {}).get("medium") == "Memory":
                src = self.shm_root / uid / vol["name"]
                src.mkdir(parents=True, exist_ok=True)
            elif not src.exists() or "emptyDir" not in vol:
                self._materialise(pod, vol, src, sb)
            if vm.get("subPath"):
                src = src / vm["subPath"]
            if self._hides_the_bed(vm["mountPath"]):
                # on a node the container has its own root filesystem; here it shares the host's, and
                # a mount over the repository or the bed's state (an emptyDir at /tmp in a checkout
                # under /tmp) would hide the python and the files the pod runs from
                self.log(
                    f"{pod['metadata']['namespace']}/{pod['metadata']['name']}: volume {vm['name']} not "
                    f"mounted at {vm['mountPath']}: it would hide the test bed's own files"
                )
                continue
            sb.mounts.append(Mount(src, vm["mountPath"], bool(vm.get("readOnly"))))
        if (entry or {}).get("privateTmp") and not any(m.target.rstrip("/") == "/tmp" for m in sb.mounts):
            if self._hides_the_bed("/tmp"):
                md = pod["metadata"]
                self.log(f"{md['namespace']}/{md['name']}: no private /tmp: it would hide the test bed's own files")
            else:
                tmp = base / "tmp"  # one per pod, shared by its containers
                tmp.mkdir(parents=True, exist_ok=True)
                tmp.chmod(0o1777)
                sb.mounts.append(Mount(tmp, "/tmp", False))
        hosts = base / "etc-hosts"  # every pod gets one, as from a kubelet
        hosts.parent.mkdir(parents=True, exist_ok=True)
        write_in_place(hosts, self._hosts(pod, snapshot if snapshot is not None else self.hosts_snapshot()))
        sb.mounts.append(Mount(hosts, "/etc/hosts", False))
        return sb

    def refresh_hosts(self, pods: list[dict], bed_hosts: Path | None = None) -> None:
        """Rewrite (in place: the file stays the one bind-mounted at /etc/hosts) the hosts file of
        every pod in `pods` that has one, and `bed_hosts` (Service names only), from one listing."""
        snap = self.hosts_snapshot()
        if not snap["ok"]:
            return  # keep what they have rather than dropping every name
        for pod in pods:
            f = self.root / pod["metadata"]["uid"] / "etc-hosts"
            if f.exists():
                write_in_place(f, self._hosts(pod, snap))
        if bed_hosts is not None:
            write_in_place(bed_hosts, self._hosts(None, snap))

    def _hides_the_bed(self, mount_path: str) -> bool:
        target = Path(mount_path).resolve()
        return any(p == target or target in p.parents for p in self.protected)

    def refresh_tokens(self, sb: Sandbox, pod: dict) -> None:
        """Re-request projected tokens that passed 80% of their lifetime."""
        now = time.time()
        for i, (path, src, at) in enumerate(sb.token_files):
            if now >= at:
                sb.token_files[i] = (path, src, self._write_token(pod, src, path))

    def forget(self, uid: str) -> None:
        shutil.rmtree(self.root / uid, ignore_errors=True)
        shutil.rmtree(self.shm_root / uid, ignore_errors=True)

    # ------------------------------------------------------------------ volumes
    def _materialise(self, pod: dict, vol: dict, dst: Path, sb: Sandbox) -> None:
        tmp = dst.with_name(dst.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        ns = pod["metadata"]["namespace"]
        if "emptyDir" in vol:
            pass
        elif "configMap" in vol:
            self._keys(tmp, self._configmap(ns, vol["configMap"]), vol["configMap"])
        elif "secret" in vol:
            src = vol["secret"]
            self._keys(tmp, self._secret(ns, {"name": src.get("secretName"), "optional": src.get("optional")}), src)
        elif "downwardAPI" in vol:
            self._downward(tmp, pod, vol["downwardAPI"].get("items") or [])
        elif "projected" in vol:
            for s in vol["projected"].get("sources") or []:
                if "serviceAccountToken" in s:
                    path = tmp / s["serviceAccountToken"]["path"]
                    sb.token_files.append(
                        (
                            dst / s["serviceAccountToken"]["path"],
                            s["serviceAccountToken"],
                            self._write_token(pod, s["serviceAccountToken"], path),
                        )
                    )
                elif "configMap" in s:
                    self._keys(tmp, self._configmap(ns, s["configMap"]), s["configMap"])
                elif "secret" in s:
                    self._keys(tmp, self._secret(ns, s["secret"]), s["secret"])
                elif "downwardAPI" in s:
                    self._downward(tmp, pod, s["downwardAPI"].get("items") or [])
        else:
            kind = next((k for k in vol if k != "name"), "?")
            raise SandboxError(f"volume {vol['name']!r}: type {kind} is not supported by the test bed")
        shutil.rmtree(dst, ignore_errors=True)
        tmp.replace(dst)

    def _configmap(self, ns: str, ref: dict) -> dict[str, bytes]:
        try:
            cm = self.request("GET", f"/api/v1/namespaces/{ns}/configmaps/{ref['name']}")
        except Exception as e:  # noqa: BLE001 - ApiError of the runner
            if ref.get("optional"):
                return {}
            raise SandboxError(f"configMap {ref['name']!r}: {e}") from None
        out = {k: v.encode() for k, v in (cm.get("data") or {}).items()}
        out.update({k: base64.b64decode(v) for k, v in (cm.get("binaryData") or {}).items()})
        return out

    def _secret(self, ns: str, ref: dict) -> dict[str, bytes]:
        try:
            s = self.request("GET", f"/api/v1/namespaces/{ns}/secrets/{ref['name']}")
        except Exception as e:  # noqa: BLE001
            if ref.get("optional"):
                return {}
            raise SandboxError(f"secret {ref['name']!r}: {e}") from None
        return {k: base64.b64decode(v) for k, v in (s.get("data") or {}).items()}

    @staticmethod
    def _keys(dst: Path, data: dict[str, bytes], ref: dict) -> None:
        items = ref.get("items")
        pairs = [(i["key"], i["path"]) for i in items] if items else [(k, k) for k in data]
        for key, path in pairs:
            if key not in data:
                if ref.get("optional"):
                    continue
                raise SandboxError(f"{ref.get('name') or ref.get('secretName')}: no key {key!r}")
            f = dst / path
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(data[key])

    @staticmethod
    def _downward(dst: Path, pod: dict, items: list[dict]) -> None:
        md = pod["metadata"]
        for it in items:
            fp = (it.get("fieldRef") or {}).get("fieldPath", "")
            val = {
                "metadata.namespace": md.get("namespace"),
                "metadata.name": md.get("name"),
                "metadata.uid": md.get("uid"),
            }.get(fp)
            if fp in ("metadata.labels", "metadata.annotations"):
                d = md.get(fp.split(".")[1]) or {}
                val = "\n".join(f'{k}="{v}"' for k, v in sorted(d.items()))
            f = dst / it["path"]
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(val or "")

    def _write_token(self, pod: dict, src: dict, path: Path) -> float:
        """TokenRequest for the pod's ServiceAccount, bound to the pod; returns when to refresh."""
        md = pod["metadata"]
        sa = pod["spec"].get("serviceAccountName") or "default"
        spec: dict = {
            "expirationSeconds": int(src.get("expirationSeconds") or 3600),
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": md["name"], "uid": md["uid"]},
        }
        if src.get("audience"):
            spec["audiences"] = [src["audience"]]
        tr = self.request(
            "POST",
            f"/api/v1/namespaces/{md['namespace']}/serviceaccounts/{sa}/token",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".new")
        tmp.write_text(tr["status"]["token"])
        tmp.replace(path)
        exp = datetime.strptime(tr["status"]["expirationTimestamp"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
        now = time.time()
        life = max(60.0, exp.timestamp() - now)
        self.log(f"service-account token for {md['namespace']}/{md['name']} (sa {sa}), valid {life / 3600:.1f} h")
        return now + 0.8 * life

    # ------------------------------------------------------------------ names
    def hosts_snapshot(self) -> dict:
        """Services and Running pods of the whole cluster, for `_hosts`."""
        try:
            services = self.request("GET", "/api/v1/services")["items"]
            running = self.request("GET", "/api/v1/pods", query={"fieldSelector": "status.phase=Running"})["items"]
        except Exception as e:  # noqa: BLE001 - names are a convenience; the container still runs
            self.log(f"services not listed for /etc/hosts: {e}")
            return {"ok": False, "services": [], "running": []}
        return {"ok": True, "services": services, "running": running}

    @staticmethod
    def _hosts(pod: dict | None, snap: dict) -> str:
        """/etc/hosts of `pod` (None: the bed-wide file, Service names only) from a snapshot."""
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        uid = None
        if pod is not None:
            md, st = pod["metadata"], pod.get("status") or {}
            uid = md["uid"]
            ip = st.get("podIP")
            if ip:
                names = [md["name"]]
                sub = pod["spec"].get("subdomain")
                if sub:
                    names.insert(0, f"{pod['spec'].get('hostname') or md['name']}.{sub}.{md['namespace']}.svc")
                lines.append(f"{ip}\t" + " ".join(names))
        # the API server refuses EndpointSlices with loopback addresses (the bed's pod IPs), so the
        # endpoints are computed here the way the endpoint controller would: Running, Ready pods
        # with an IP whose labels match the Service's selector (not-ready ones too where the Service
        # publishes them, as KubeRay's head Service does)
        services, running = snap["services"], snap["running"]
        for svc in services:
            ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
            sel = (svc.get("spec") or {}).get("selector") or {}
            if not sel:
                continue
            any_readiness = bool((svc.get("spec") or {}).get("publishNotReadyAddresses"))
            ep = next(
                (
                    p["status"]["podIP"]
                    for p in running
                    if p["metadata"]["namespace"] == ns
                    and (p.get("status") or {}).get("podIP")
                    and not p["metadata"].get("deletionTimestamp")
                    and (any_readiness or pod_ready(p))
                    and all((p["metadata"].get("labels") or {}).get(k) == v for k, v in sel.items())
                ),
                None,
            )
            if ep:
                lines.append(f"{ep}\t{name}.{ns}.svc {name}.{ns}.svc.cluster.local")
        # hostname.subdomain.ns.svc of pods behind a headless Service (multi-node rendezvous)
        for p in running:
            ps, pm = p.get("spec") or {}, p["metadata"]
            if ps.get("subdomain") and (p.get("status") or {}).get("podIP") and pm["uid"] != uid:
                host = f"{ps.get('hostname') or pm['name']}.{ps['subdomain']}.{pm['namespace']}.svc"
                lines.append(f"{p['status']['podIP']}\t{host} {host}.cluster.local")
        return "\n".join(lines) + "\n"


def write_in_place(path: Path, text: str) -> None:
    """Write `text` into `path` without replacing the file (a bind mount of it keeps showing the
    new content): only when it changed, the new bytes first, then the tail cut."""
    data = text.encode()
    try:
        with open(path, "r+b") as f:
            if f.read() == data:
                return
            f.seek(0)
            f.write(data)
            f.truncate()
    except FileNotFoundError:
        path.write_bytes(data)


class SandboxError(RuntimeError):
    """The pod's volumes cannot be set up (a kubelet would report CreateContainerConfigError)."""


def token_subject(token: str) -> str:
    """The `sub` claim of a service-account JWT (for logs and tests)."""
    payload = token.split(".")[1]
    payload += "=" * (-len(payload) % 4)
    return json.loads(base64.urlsafe_b64decode(payload)).get("sub", "")
