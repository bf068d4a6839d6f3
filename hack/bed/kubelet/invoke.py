"""How the pod runner invokes a container: its argv from the pod and hack/images.yaml, its env as a
kubelet composes it (values, fieldRef, resourceFieldRef, configMap/secret refs, envFrom, $(VAR)).
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hack.bed.images import glob_to_regex  # the same translation kwok's stages use
from hack.bed.kubelet.api import ApiError
from hack.bed.paths import HACK, REPO

PYTHONS = (
    "python",
    "python3",
    "/usr/bin/python",
    "/usr/bin/python3",
    "/usr/local/bin/python",
    "/usr/local/bin/python3",
)

PODNET = Path(__file__).resolve().parent / "podnet"  # put on PYTHONPATH of `podNetwork` images

ReadData = Callable[[str, str, str], dict]  # (kind "configMap"|"secret", namespace, name) -> data


def expand(s: str, env: dict[str, str]) -> str:
    """Kubernetes $(VAR) expansion; $$(VAR) escapes."""

    def rep(m: re.Match) -> str:
        if m.group(0).startswith("$$"):
            return m.group(0)[1:]
        return env.get(m.group(1), m.group(0))

    return re.sub(r"\$\$?\(([A-Za-z_][A-Za-z0-9_.-]*)\)", rep, s)


def field_ref(pod: dict, path: str) -> str:
    """The downward API value of `path` (a fieldRef's fieldPath)."""
    md, spec, st = pod["metadata"], pod["spec"], pod.get("status", {})
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return (md.get(m.group(1)) or {}).get(m.group(2), "")
    simple = {
        "metadata.name": md.get("name"),
        "metadata.namespace": md.get("namespace"),
        "metadata.uid": md.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": st.get("podIP"),
        "status.hostIP": st.get("hostIP"),
        "status.podIPs": ",".join(i["ip"] for i in st.get("podIPs", [])),
        "status.hostIPs": ",".join(i["ip"] for i in st.get("hostIPs", [])),
    }
    if path in ("metadata.labels", "metadata.annotations"):
        d = md.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(d.items()))
    return simple.get(path) or ""


def _decoded(kind: str, data: dict) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in data.items()} if kind == "secret" else data


def _ref_value(read: ReadData, pod: dict, kind: str, ref: dict) -> str | None:
    try:
        raw = read(kind, pod["metadata"]["namespace"], ref["name"]).get(ref["key"])
    except ApiError:
        return None
    return _decoded(kind, {"v": raw})["v"] if raw is not None else None


def _value_from(read: ReadData, pod: dict, c: dict, vf: dict) -> str | None:
    if "fieldRef" in vf:
        return field_ref(pod, vf["fieldRef"]["fieldPath"])
    if "resourceFieldRef" in vf:
        kind, res = vf["resourceFieldRef"]["resource"].split(".", 1)
        return str(((c.get("resources") or {}).get(kind) or {}).get(res, "0"))
    if "configMapKeyRef" in vf:
        return _ref_value(read, pod, "configMap", vf["configMapKeyRef"])
    if "secretKeyRef" in vf:
        return _ref_value(read, pod, "secret", vf["secretKeyRef"])
    return None


def container_env(read: ReadData, pod: dict, c: dict) -> dict[str, str]:
    """The env the pod spec gives container `c`: envFrom first, then env in order ($(VAR) of earlier
    names expanded); a missing optional ref gives nothing (envFrom) or "" (env)."""
    env: dict[str, str] = {}
    for ef in c.get("envFrom", []) or []:
        prefix = ef.get("prefix", "")
        for kind in ("configMap", "secret"):
            ref = ef.get(f"{kind}Ref")
            if not ref:
                continue
            with contextlib.suppress(Exception):  # a missing (optional) source adds nothing
                data = _decoded(kind, read(kind, pod["metadata"]["namespace"], ref["name"]))
                env.update({prefix + k: v for k, v in data.items()})
    for e in c.get("env", []) or []:
        name = e["name"]
        if "value" in e:
            env[name] = expand(e.get("value") or "", env)
        elif "valueFrom" in e:
            val = _value_from(read, pod, c, e["valueFrom"])
            env[name] = val if val is not None else ""
        else:
            env[name] = ""
    return env


def read_bed_env(state: Path) -> dict[str, str]:
    """RLTUNE_PUSHGATEWAY_URL/RLTUNE_PROMETHEUS_URL of the bed (state/env), for `bedEnv` images."""
    env = {}
    envf = state / "env"
    if envf.exists():
        for line in envf.read_text().splitlines():
            if "=" in line:
                k, v = line.split("=", 1)
                env[k] = v
    return {
        "RLTUNE_PUSHGATEWAY_URL": env.get("PUSHGATEWAY_URL", "http://127.0.0.1:19091"),
        "RLTUNE_PROMETHEUS_URL": env.get("PROMETHEUS_URL", "http://127.0.0.1:19090"),
    }


@dataclass
class Invocation:
    argv: list[str]
    env: dict[str, str]
    cwd: str


class Invoker:
    """Maps images to local commands (hack/images.yaml) and builds a container's Invocation."""

    def __init__(self, read: ReadData, state: Path):
        import yaml

        self.read = read
        self.state = state
        images = yaml.safe_load((HACK / "images.yaml").read_text())["images"]
        self.image_rx = [
            (e, re.compile("^(?:" + "|".join(glob_to_regex(g) for g in e["match"]) + ")$")) for e in images
        ]
        self.python = str(REPO / ".venv" / "bin" / "python")
        if not Path(self.python).exists():
            self.python = sys.executable
        # no KUBECONFIG: a pod reaches the API server only as its ServiceAccount (sandbox.py)
        self.bed_env = read_bed_env(state)

    def image_entry(self, image: str) -> dict | None:
        for e, rx in self.image_rx:
            if rx.match(image):
                return e
        return None

    def mapped_containers(self, pod: dict) -> list[dict]:
        return [c for c in pod["spec"].get("containers", []) if self.image_entry(c.get("image", ""))]

    def init_containers(self, pod: dict) -> list[dict]:
        """The pod's init containers in order (run by the runner when the pod is one of its own)."""
        return list(pod["spec"].get("initContainers") or [])

    def argv_for(self, c: dict, env: dict) -> list[str]:
        """command + args of the container, else of its image entry; `python` -> the repo's venv."""
        entry = self.image_entry(c["image"]) or {}
        if c.get("command"):
            cmd = list(c["command"])
            args = list(c.get("args") or [])
        else:
            cmd = list(entry.get("command") or [])
            args = list(c.get("args") if c.get("args") is not None else entry.get("args") or [])
        argv = [expand(a, env) for a in cmd + args]
        if argv and argv[0] in PYTHONS:
            argv[0] = self.python
        return argv

    def invocation(self, pod: dict, c: dict, sandbox_env: dict[str, str]) -> Invocation:
        """argv, env and cwd of container `c`. Env precedence, lowest first: the runner's own env
        (without PYTHONPATH/KUBECONFIG), the bed's URLs (bedEnv images), the sandbox's, PYTHONPATH,
        the pod's; RLTUNE_POD_UID/RLTUNE_BED_STATE always."""
        md = pod["metadata"]
        pod_env = container_env(self.read, pod, c)
        entry = self.image_entry(c.get("image", "")) or {}
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KUBECONFIG")}
        if entry.get("bedEnv"):
            env.update(self.bed_env)
        if entry.get("venvPath"):  # the image's own tools (ray, python, pip) are the venv's
            env["PATH"] = os.pathsep.join([str(Path(self.python).parent), env.get("PATH", "/usr/bin:/bin")])
        env.update(sandbox_env)
        pythonpath = [str(REPO / "operator"), str(REPO)]
        if entry.get("podNetwork"):  # podnet/sitecustomize.py: the pod's own network for Python
            pythonpath.insert(0, str(PODNET))
            env["RLTUNE_POD_IP"] = (pod.get("status") or {}).get("podIP") or ""
        env["PYTHONPATH"] = os.pathsep.join(pythonpath)
        env.update(pod_env)  # the pod's env wins
        env["RLTUNE_POD_UID"] = md["uid"]
        env["RLTUNE_BED_STATE"] = str(self.state)
        env.setdefault("HOSTNAME", md["name"])
        cwd = c.get("workingDir") or str(REPO)
        if not Path(cwd).is_dir():
            cwd = str(REPO)
        return Invocation(self.argv_for(c, pod_env), env, cwd)
