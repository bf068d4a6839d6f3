#!/usr/bin/env python3
"""Local pod runner of the rltune test bed.

kwok nodes have no kubelet: kwok only makes pods *look* Running. This runner executes the
containers of pods whose image is mapped in hack/images.yaml as local processes and reports their
fate back into the pod status, like a minimal kubelet:

* start: once kwok has made the pod Running (pod IP assigned), each mapped container's
  command + args run as a process in its own session (process group), with the pod's env
  (values, downward-API fieldRefs, resourceFieldRefs, configMap/secret refs, envFrom), cwd = repo
  root, PYTHONPATH = operator/ + repo root, `python`/`python3` -> the repo's .venv/bin/python.
  Identity, volumes and names as a kubelet gives them (hack/podsandbox.py): the pod's volumes
  (configMap, secret, emptyDir, downwardAPI, projected service-account token from the TokenRequest
  API) bind-mounted in a private mount namespace, KUBERNETES_SERVICE_HOST/PORT, and an /etc/hosts
  with Service names; never the bed's admin kubeconfig, so the API server enforces the pod's RBAC.
  Extra env: RLTUNE_PUSHGATEWAY_URL and RLTUNE_PROMETHEUS_URL for images marked `bedEnv` in
  hack/images.yaml (unless the pod sets them), RLTUNE_POD_UID, RLTUNE_BED_STATE.
  Output (stdout+stderr) goes to .state/bed/pods/<namespace>_<name>.log.
* exit: exit code 0 -> container terminated/Completed; non-zero -> Error; 137 -> OOMKilled.
  Pod phase Succeeded / Failed once every mapped container is done (restartPolicy Never, or
  OnFailure with exit 0); Always / OnFailure restart the container with back-off.
* delete: a pod with deletionTimestamp gets SIGTERM on its process groups, SIGKILL after the
  grace period (capped at 30 s), then the runner finalizes the deletion (grace 0), as a kubelet does.
* restart-safe: pid + process start time + pod UID are recorded in .state/bed/runner/; on start
  live processes are re-adopted, processes that finished meanwhile are reported from their exit
  file, and containers already terminated are never run again.
* Prometheus: pods annotated prometheus.io/scrape=true get a file_sd target
  <podIP>:<prometheus.io/port> (path prometheus.io/path) in .state/bed/prometheus/targets/.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HACK = REPO / "hack"
TERMINAL = ("Succeeded", "Failed")
MAX_GRACE = 30.0


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def log(msg: str) -> None:
    print(f"[podrunner {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def proc_starttime(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]  # field 22 of stat: start time in clock ticks


def group_alive(pgid: int) -> bool:
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


def alive(pid: int, starttime: str | None) -> bool:
    st = proc_starttime(pid)
    return st is not None and (starttime is None or st == starttime)


class Proc:
    """One running (or finished) container process."""

    def __init__(self, rec: dict, popen: subprocess.Popen | None = None):
        self.rec = rec  # persisted: uid, ns, name, container, pid, starttime, exitfile, ...
        self.popen = popen
        self.kill_at: float | None = None  # SIGKILL deadline once SIGTERM was sent

    @property
    def key(self) -> str:
        return f"{self.rec['uid']}_{self.rec['container']}"

    def is_alive(self) -> bool:
        if self.popen is not None:
            sh_alive = self.popen.poll() is None
        else:
            sh_alive = alive(self.rec["pid"], self.rec.get("starttime"))
        if sh_alive:
            return True
        # the sh wrapper dies on SIGTERM at once; while terminating, the container is alive as
        # long as anything of its process group is (e.g. a child that handles SIGTERM slowly)
        return self.kill_at is not None and group_alive(self.rec["pid"])

    def exit_code(self) -> int:
        ef = Path(self.rec["exitfile"])
        for _ in range(10):
            if ef.exists():
                txt = ef.read_text().strip()
                if txt:
                    return int(txt)
            time.sleep(0.02)
        if self.popen is not None and self.popen.returncode is not None:
            rc = self.popen.returncode
            return 128 - rc if rc < 0 else rc
        return -1  # unknown: lost while the runner was down

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.rec["pid"], sig)
        except (ProcessLookupError, PermissionError):
            pass


class Runner:
    def __init__(self, kubeconfig: str, state: Path):
        from kubernetes import client, config
        self.kubeconfig = kubeconfig
        self.state = state
        self.recdir = state / "runner"
        self.podlogs = state / "pods"
        self.targets = state / "prometheus" / "targets"
        for d in (self.recdir, self.podlogs, self.targets):
            d.mkdir(parents=True, exist_ok=True)
        self.client = config.new_client_from_config(kubeconfig)
        self.api = client.CoreV1Api(self.client)
        self.server = self.client.configuration.host.rstrip("/")
        from urllib.parse import urlsplit
        from podsandbox import PodSandboxes
        api = urlsplit(self.server)
        self.sandboxes = PodSandboxes(state, self.request, api.hostname, api.port or 443, log)
        self.sandbox: dict[str, object] = {}  # container key -> its Sandbox (token refresh)
        self._ssl = None
        import yaml
        self.images = yaml.safe_load((HACK / "images.yaml").read_text())["images"]
        from testbed import glob_to_regex  # the same translation kwok's stages use
        self.image_rx = [(e, re.compile("^(?:" + "|".join(glob_to_regex(g) for g in e["match"]) + ")$"))
                         for e in self.images]
        self.python = str(REPO / ".venv" / "bin" / "python")
        if not Path(self.python).exists():
            self.python = sys.executable
        self.pods: dict[str, dict] = {}        # uid -> latest pod object (mapped pods only)
        self.procs: dict[str, Proc] = {}       # "<uid>_<container>" -> Proc
        self.restart_at: dict[str, float] = {}  # container key -> when to restart
        self.finalizing: set[str] = set()     # uids whose deletion we finalized
        self.tails: dict[str, list] = {}       # uid -> [raw log, CRI log, offset, last activity]
        self.logs_crd = True                   # kwok's Logs CRD installed (kubectl logs)
        self.events: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        env = {}
        envf = state / "env"
        if envf.exists():
            for line in envf.read_text().splitlines():
                if "=" in line:
                    k, v = line.split("=", 1)
                    env[k] = v
        # no KUBECONFIG: a pod reaches the API server only as its ServiceAccount (hack/podsandbox.py)
        self.bed_env = {
            "RLTUNE_PUSHGATEWAY_URL": env.get("PUSHGATEWAY_URL", "http://127.0.0.1:19091"),
            "RLTUNE_PROMETHEUS_URL": env.get("PROMETHEUS_URL", "http://127.0.0.1:19090"),
        }

    # ------------------------------------------------------------------ API helpers
    def _open(self, method: str, path: str, body=None, query=None,
              content_type: str = "application/json", timeout: float = 30):
        import ssl
        import urllib.parse
        import urllib.request
        if self._ssl is None:
            pki = self.state / "pki"
            ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
            ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
            self._ssl = ctx
        url = self.server + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method, headers={
            "Accept": "application/json", "Content-Type": content_type})
        return urllib.request.urlopen(req, context=self._ssl, timeout=timeout)

    def request(self, method: str, path: str, body=None, query=None,
                content_type: str = "application/json", timeout: float = 30):
        """Plain HTTPS call to the apiserver; raises ApiError on a non-2xx answer."""
        import urllib.error
        try:
            with self._open(method, path, body, query, content_type, timeout) as r:
                data = r.read()
        except urllib.error.HTTPError as e:
            raise ApiError(e.code, e.read().decode(errors="replace")) from None
        return json.loads(data) if data else None

    def patch_status(self, pod: dict, status: dict) -> None:
        md = pod["metadata"]
        try:
            self.request("PATCH", f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}/status",
                         body={"metadata": {"uid": md["uid"]}, "status": status},
                         content_type="application/strategic-merge-patch+json")
        except ApiError as e:
            if e.status not in (404, 409, 422):
                raise
            log(f"status patch of {md['namespace']}/{md['name']} failed: {e}")

    def delete_now(self, pod: dict) -> None:
        md = pod["metadata"]
        try:
            self.request("DELETE", f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}",
                         body={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                               "preconditions": {"uid": md["uid"]}})
            log(f"finalized deletion of {md['namespace']}/{md['name']}")
        except ApiError as e:
            if e.status not in (404, 409):
                raise

    # ------------------------------------------------------------------ mapping
    def image_entry(self, image: str) -> dict | None:
        for e, rx in self.image_rx:
            if rx.match(image):
                return e
        return None

    def mapped_containers(self, pod: dict) -> list[dict]:
        return [c for c in pod["spec"].get("containers", []) if self.image_entry(c.get("image", ""))]

    # ------------------------------------------------------------------ env
    def _ref_value(self, pod: dict, kind: str, ref: dict) -> str | None:
        from kubernetes.client.rest import ApiException
        ns = pod["metadata"]["namespace"]
        try:
            if kind == "configMap":
                obj = self.api.read_namespaced_config_map(ref["name"], ns)
                data = obj.data or {}
                return data.get(ref["key"])
            obj = self.api.read_namespaced_secret(ref["name"], ns)
            import base64
            raw = (obj.data or {}).get(ref["key"])
            return base64.b64decode(raw).decode() if raw is not None else None
        except ApiException:
            return None

    @staticmethod
    def field_ref(pod: dict, path: str) -> str:
        md, spec, st = pod["metadata"], pod["spec"], pod.get("status", {})
        m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        if m:
            return (md.get(m.group(1)) or {}).get(m.group(2), "")
        simple = {
            "metadata.name": md.get("name"), "metadata.namespace": md.get("namespace"),
            "metadata.uid": md.get("uid"), "spec.nodeName": spec.get("nodeName"),
            "spec.serviceAccountName": spec.get("serviceAccountName"),
            "status.podIP": st.get("podIP"), "status.hostIP": st.get("hostIP"),
            "status.podIPs": ",".join(i["ip"] for i in st.get("podIPs", [])),
            "status.hostIPs": ",".join(i["ip"] for i in st.get("hostIPs", [])),
        }
        if path in ("metadata.labels", "metadata.annotations"):
            d = md.get(path.split(".")[1]) or {}
            return "\n".join(f'{k}="{v}"' for k, v in sorted(d.items()))
        return simple.get(path) or ""

    def container_env(self, pod: dict, c: dict) -> dict[str, str]:
        env: dict[str, str] = {}
        for ef in c.get("envFrom", []) or []:
            prefix = ef.get("prefix", "")
            for kind in ("configMap", "secret"):
                ref = ef.get(f"{kind}Ref")
                if not ref:
                    continue
                try:
                    if kind == "configMap":
                        data = self.api.read_namespaced_config_map(
                            ref["name"], pod["metadata"]["namespace"]).data or {}
                    else:
                        import base64
                        raw = self.api.read_namespaced_secret(
                            ref["name"], pod["metadata"]["namespace"]).data or {}
                        data = {k: base64.b64decode(v).decode() for k, v in raw.items()}
                    env.update({prefix + k: v for k, v in data.items()})
                except Exception:  # noqa: BLE001 - optional refs
                    pass
        for e in c.get("env", []) or []:
            name = e["name"]
            if "value" in e:
                env[name] = expand(e.get("value") or "", env)
            elif "valueFrom" in e:
                vf = e["valueFrom"]
                val = None
                if "fieldRef" in vf:
                    val = self.field_ref(pod, vf["fieldRef"]["fieldPath"])
                elif "resourceFieldRef" in vf:
                    r = vf["resourceFieldRef"]
                    kind, res = r["resource"].split(".", 1)
                    val = str(((c.get("resources") or {}).get(kind) or {}).get(res, "0"))
                elif "configMapKeyRef" in vf:
                    val = self._ref_value(pod, "configMap", vf["configMapKeyRef"])
                elif "secretKeyRef" in vf:
                    val = self._ref_value(pod, "secret", vf["secretKeyRef"])
                env[name] = val if val is not None else ""
            else:
                env[name] = ""
        return env

    def argv_for(self, c: dict, env: dict) -> list[str]:
        entry = self.image_entry(c["image"]) or {}
        if c.get("command"):
            cmd = list(c["command"])
            args = list(c.get("args") or [])
        else:
            cmd = list(entry.get("command") or [])
            args = list(c.get("args") if c.get("args") is not None else entry.get("args") or [])
        argv = [expand(a, env) for a in cmd + args]
        if argv and argv[0] in ("python", "python3", "/usr/bin/python", "/usr/bin/python3",
                                "/usr/local/bin/python", "/usr/local/bin/python3"):
            argv[0] = self.python
        return argv

    # ------------------------------------------------------------------ lifecycle
    def start_container(self, pod: dict, c: dict, restart_count: int = 0) -> None:
        md = pod["metadata"]
        key = f"{md['uid']}_{c['name']}"
        pod_env = self.container_env(pod, c)
        argv = self.argv_for(c, pod_env)
        from podsandbox import SandboxError
        try:
            sb = self.sandboxes.prepare(pod, c)
        except (SandboxError, ApiError) as e:
            # what a kubelet reports when a volume cannot be set up; retried on the next event
            log(f"{md['namespace']}/{md['name']} [{c['name']}]: {e}")
            self.patch_container(pod, c["name"], {"waiting": {"reason": "CreateContainerConfigError",
                                                              "message": str(e)[:500]}}, ready=False)
            return
        logfile = self.podlogs / f"{md['namespace']}_{md['name']}.log"
        exitfile = self.recdir / f"{key}.exit"
        exitfile.unlink(missing_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KUBECONFIG")}
        if (self.image_entry(c.get("image", "")) or {}).get("bedEnv"):
            env.update(self.bed_env)
        env.update(sb.env)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "operator"), str(REPO)])
        env.update(pod_env)  # the pod's env wins
        env["RLTUNE_POD_UID"] = md["uid"]
        env["RLTUNE_BED_STATE"] = str(self.state)
        env["RLTUNE_EXIT_FILE"] = str(exitfile)
        env.setdefault("HOSTNAME", md["name"])
        cwd = c.get("workingDir") or str(REPO)
        if not Path(cwd).is_dir():
            cwd = str(REPO)
        with open(logfile, "ab") as lf:
            lf.write(f"==== {now_iso()} container {c['name']} start #{restart_count}: "
                     f"{json.dumps(argv)}\n".encode())
            lf.flush()
            if not argv:
                argv = ["/bin/sh", "-c", "echo 'no command for this image' >&2; exit 127"]
            # sh records the exit code even when the runner is not around to wait() for it
            p = subprocess.Popen(
                sb.wrap(["/bin/sh", "-c", '"$@"; echo $? > "$RLTUNE_EXIT_FILE"', "rltune-pod", *argv]),
                stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                start_new_session=True, close_fds=True)
        self.ensure_kubectl_logs(pod, logfile)
        rec = {"uid": md["uid"], "namespace": md["namespace"], "name": md["name"],
               "container": c["name"], "pid": p.pid, "starttime": proc_starttime(p.pid),
               "exitfile": str(exitfile), "log": str(logfile), "startedAt": now_iso(),
               "restartCount": restart_count, "argv": argv}
        self.save(rec)
        self.procs[key] = Proc(rec, p)
        self.sandbox[key] = sb
        log(f"started {md['namespace']}/{md['name']} [{c['name']}] pid {p.pid}: {' '.join(argv)}")
        if restart_count:
            self.patch_container(pod, c["name"], {"running": {"startedAt": rec["startedAt"]}},
                                 ready=True, restart_count=restart_count)

    # ------------------------------------------------------------------ kubectl logs
    # kwok serves `kubectl logs` (apiserver -> kwok's kubelet port) from a CRI-format file named
    # by a kwok `Logs` object; the runner keeps <ns>_<name>.cri.log in step with the plain log.
    def ensure_kubectl_logs(self, pod: dict, logfile: Path) -> None:
        md = pod["metadata"]
        uid = md["uid"]
        cri = logfile.with_suffix(".cri.log")
        if uid not in self.tails:
            cri.write_bytes(b"")  # (re)generated from the plain log, also after a runner restart
            self.tails[uid] = [logfile, cri, 0, time.time()]
        if not self.logs_crd:
            return
        body = {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Logs",
                "metadata": {"name": md["name"], "namespace": md["namespace"],
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Pod",
                                                  "name": md["name"], "uid": uid}]},
                "spec": {"logs": [{"containers": [c["name"] for c in pod["spec"]["containers"]],
                                   "logsFile": str(cri), "follow": True}]}}
        try:
            self.request("POST", f"/apis/kwok.x-k8s.io/v1alpha1/namespaces/{md['namespace']}/logs",
                         body=body)
        except ApiError as e:
            if e.status == 404:
                self.logs_crd = False
                log("kwok Logs CRD not installed: kubectl logs not wired")
            elif e.status != 409:
                log(f"creating Logs for {md['namespace']}/{md['name']} failed: {e}")

    def pump_logs(self, final: set[str] = frozenset()) -> None:
        t = time.time()
        for uid, tail in list(self.tails.items()):
            raw, cri, off, last = tail
            try:
                size = raw.stat().st_size
            except OSError:
                size = 0
            if size > off:
                with open(raw, "rb") as f:
                    f.seek(off)
                    data = f.read(size - off)
                cut = data.rfind(b"\n") + 1
                if uid in final:
                    cut = len(data)
                if cut:
                    ts = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ").encode()
                    lines = data[:cut].split(b"\n")
                    if lines and lines[-1] == b"":
                        lines.pop()
                    # the runner's own "==== ... container x start/exited" lines stay out
                    lines = [ln for ln in lines
                             if not (ln.startswith(b"==== ") and b" container " in ln)]
                    with open(cri, "ab") as f:
                        f.write(b"".join(ts + b" stdout F " + ln + b"\n" for ln in lines))
                    tail[2] = off + cut
                    tail[3] = t
            if uid not in self.pods and t - tail[3] > 5:
                self.tails.pop(uid, None)  # pod gone: stop following

    def save(self, rec: dict) -> None:
        f = self.recdir / f"{rec['uid']}_{rec['container']}.json"
        tmp = f.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec))
        tmp.replace(f)

    def forget(self, key: str) -> None:
        for suffix in (".json", ".exit"):
            (self.recdir / f"{key}{suffix}").unlink(missing_ok=True)
        p = self.procs.pop(key, None)
        self.sandbox.pop(key, None)
        if p is not None and not any(q.rec["uid"] == p.rec["uid"] for q in self.procs.values()):
            self.sandboxes.forget(p.rec["uid"])
        self.restart_at.pop(key, None)

    def container_statuses(self, pod: dict) -> dict[str, dict]:
        return {s["name"]: s for s in (pod.get("status") or {}).get("containerStatuses", []) or []}

    def patch_container(self, pod: dict, cname: str, state: dict, ready: bool,
                        restart_count: int = 0, last_state: dict | None = None,
                        phase: str | None = None, all_states: dict | None = None) -> None:
        statuses = self.container_statuses(pod)
        out = []
        for c in pod["spec"]["containers"]:
            s = dict(statuses.get(c["name"]) or {"name": c["name"], "image": c["image"],
                                                  "imageID": "", "restartCount": 0})
            if c["name"] == cname:
                s.update({"state": state, "ready": ready, "started": "running" in state,
                          "restartCount": restart_count})
                if last_state is not None:
                    s["lastState"] = last_state
            elif all_states and c["name"] in all_states:
                s.update({"state": all_states[c["name"]], "ready": False, "started": False})
            out.append(s)
        status: dict = {"containerStatuses": out}
        t = now_iso()
        if phase:
            status["phase"] = phase
            reason = "PodCompleted" if phase == "Succeeded" else "PodFailed"
            status["conditions"] = [
                {"type": "Ready", "status": "False", "reason": reason, "lastTransitionTime": t},
                {"type": "ContainersReady", "status": "False", "reason": reason,
                 "lastTransitionTime": t}]
        elif not ready:
            status["conditions"] = [
                {"type": "Ready", "status": "False", "reason": "ContainersNotReady",
                 "lastTransitionTime": t},
                {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady",
                 "lastTransitionTime": t}]
        elif restart_count:
            status["conditions"] = [
                {"type": "Ready", "status": "True", "lastTransitionTime": t},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": t}]
        self.patch_status(pod, status)
        # keep our cached copy current so later patches build on it
        pod.setdefault("status", {})["containerStatuses"] = out
        if phase:
            pod["status"]["phase"] = phase

    def on_exit(self, proc: Proc) -> None:
        rec = proc.rec
        code = proc.exit_code()
        lost = code < 0
        if lost:
            code = 255
        reason = ("ContainerStatusUnknown" if lost else "Completed" if code == 0
                  else "OOMKilled" if code == 137 else "Error")
        proc.signal(signal.SIGKILL)  # like a container: nothing of it outlives its main process
        rec.update({"exitCode": code, "finishedAt": now_iso(), "reason": reason, "done": True})
        self.save(rec)
        proc.popen = None
        with open(rec["log"], "ab") as lf:
            lf.write(f"==== {now_iso()} container {rec['container']} exited {code} ({reason})\n".encode())
        log(f"{rec['namespace']}/{rec['name']} [{rec['container']}] exited {code} ({reason})")
        self.pump_logs(final={rec["uid"]})
        pod = self.pods.get(rec["uid"])
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return
        term = {"terminated": {"exitCode": code, "reason": reason, "startedAt": rec["startedAt"],
                               "finishedAt": rec["finishedAt"],
                               **({"message": "process lost while the pod runner was down"}
                                  if lost else {})}}
        policy = pod["spec"].get("restartPolicy", "Always")
        if policy == "Always" or (policy == "OnFailure" and code != 0):
            n = rec.get("restartCount", 0)
            self.restart_at[proc.key] = time.time() + min(30.0, 1.0 * 2 ** min(n, 5))
            self.patch_container(pod, rec["container"],
                                 {"waiting": {"reason": "CrashLoopBackOff" if code else "Completed"}},
                                 ready=False, restart_count=n, last_state=term)
            return
        # is every mapped container of the pod done for good?
        mapped = self.mapped_containers(pod)
        recs = {c["name"]: self.procs.get(f"{rec['uid']}_{c['name']}") for c in mapped}
        done = all(p is not None and p.rec.get("done") for p in recs.values())
        if not done:
            self.patch_container(pod, rec["container"], term, ready=False,
                                 restart_count=rec.get("restartCount", 0))
            return
        codes = [p.rec["exitCode"] for p in recs.values()]
        phase = "Succeeded" if all(c == 0 for c in codes) else "Failed"
        # unmapped sidecars of a finished pod are stopped too
        others = {c["name"]: {"terminated": {"exitCode": 0, "reason": "Completed",
                                             "finishedAt": rec["finishedAt"]}}
                  for c in pod["spec"]["containers"] if c["name"] not in recs}
        for c in mapped:
            if c["name"] != rec["container"]:
                r = recs[c["name"]].rec
                others[c["name"]] = {"terminated": {"exitCode": r["exitCode"], "reason": r["reason"],
                                                    "startedAt": r["startedAt"],
                                                    "finishedAt": r["finishedAt"]}}
        self.patch_container(pod, rec["container"], term, ready=False,
                             restart_count=rec.get("restartCount", 0), phase=phase, all_states=others)
        self.remove_target(pod)

    # ------------------------------------------------------------------ reconcile
    def reconcile(self, pod: dict, deleted: bool = False) -> None:
        md = pod["metadata"]
        uid = md["uid"]
        mapped = self.mapped_containers(pod)
        if not mapped:
            return
        if deleted:
            self.pods.pop(uid, None)
            self.remove_target(pod)
            for key, p in list(self.procs.items()):
                if p.rec["uid"] == uid:
                    if p.is_alive():
                        self.terminate(p, grace=2.0)
                    else:
                        self.forget(key)
            return
        self.pods[uid] = pod
        if md.get("deletionTimestamp"):
            grace = md.get("deletionGracePeriodSeconds")
            grace = MAX_GRACE if grace is None else min(float(grace), MAX_GRACE)
            self.remove_target(pod)
            live = False
            for key, p in list(self.procs.items()):
                if p.rec["uid"] != uid:
                    continue
                if p.is_alive():
                    live = True
                    if p.kill_at is None:
                        self.terminate(p, grace)
                self.restart_at.pop(key, None)
            if not live and uid not in self.finalizing:
                self.finalizing.add(uid)
                self.delete_now(pod)
            return
        if not pod["spec"].get("nodeName"):
            return
        st = pod.get("status") or {}
        if st.get("phase") != "Running" or not st.get("podIP"):
            return  # wait for kwok to make it Running (pod IP assigned)
        self.write_target(pod)
        statuses = self.container_statuses(pod)
        for c in mapped:
            key = f"{uid}_{c['name']}"
            if key in self.procs:
                continue
            if "terminated" in ((statuses.get(c["name"]) or {}).get("state") or {}):
                continue  # already ran (e.g. before a runner restart whose records were wiped)
            self.start_container(pod, c)

    def terminate(self, p: Proc, grace: float) -> None:
        log(f"terminating {p.rec['namespace']}/{p.rec['name']} [{p.rec['container']}] "
            f"pid {p.rec['pid']} (grace {grace:g}s)")
        p.signal(signal.SIGTERM)
        p.kill_at = time.time() + grace

    def tick(self) -> None:
        t = time.time()
        self.pump_logs()
        for key, sb in list(self.sandbox.items()):
            p = self.procs.get(key)
            pod = self.pods.get(p.rec["uid"]) if p else None
            if pod is not None and sb.token_files and not p.rec.get("done"):
                try:
                    self.sandboxes.refresh_tokens(sb, pod)
                except Exception as e:  # noqa: BLE001 - retried next tick, like a kubelet
                    log(f"token refresh for {p.rec['namespace']}/{p.rec['name']} failed: {e}")
        for key, p in list(self.procs.items()):
            if p.rec.get("done"):
                continue
            if p.is_alive():
                if p.kill_at is not None and t >= p.kill_at:
                    log(f"SIGKILL {p.rec['namespace']}/{p.rec['name']} pid {p.rec['pid']}")
                    p.signal(signal.SIGKILL)
                    p.kill_at = t + 5
                continue
            if p.kill_at is not None:
                # terminated on deletion: sweep the group, then finalize the pod deletion
                p.signal(signal.SIGKILL)
                if p.popen is not None:
                    p.popen.poll()
                uid = p.rec["uid"]
                self.forget(key)
                pod = self.pods.get(uid)
                if pod is not None and not any(q.rec["uid"] == uid and q.is_alive()
                                               for q in self.procs.values()):
                    if uid not in self.finalizing:
                        self.finalizing.add(uid)
                        self.delete_now(pod)
                continue
            self.on_exit(p)
        for key, when in list(self.restart_at.items()):
            if t < when:
                continue
            self.restart_at.pop(key)
            p = self.procs.get(key)
            if p is None:
                continue
            pod = self.pods.get(p.rec["uid"])
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                continue
            c = next((c for c in pod["spec"]["containers"] if c["name"] == p.rec["container"]), None)
            if c is not None:
                self.procs.pop(key, None)
                self.start_container(pod, c, restart_count=p.rec.get("restartCount", 0) + 1)

    # ------------------------------------------------------------------ prometheus file_sd
    def write_target(self, pod: dict) -> None:
        md = pod["metadata"]
        ann = md.get("annotations") or {}
        if ann.get("prometheus.io/scrape") != "true" or not ann.get("prometheus.io/port"):
            return
        f = self.targets / f"{md['namespace']}_{md['name']}.json"
        if f.exists():
            return
        labels = {"namespace": md["namespace"], "pod": md["name"],
                  "__metrics_path__": ann.get("prometheus.io/path", "/metrics")}
        for k, v in (md.get("labels") or {}).items():
            labels["pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", k)] = v
        tmp = f.with_suffix(".tmp")
        tmp.write_text(json.dumps([{"targets": [f"{pod['status']['podIP']}:{ann['prometheus.io/port']}"],
                                    "labels": labels}]))
        tmp.replace(f)

    def remove_target(self, pod: dict) -> None:
        md = pod["metadata"]
        (self.targets / f"{md['namespace']}_{md['name']}.json").unlink(missing_ok=True)

    # ------------------------------------------------------------------ startup / watch
    def adopt(self, pods: list[dict]) -> None:
        by_uid = {p["metadata"]["uid"]: p for p in pods}
        for f in sorted(self.recdir.glob("*.json")):
            try:
                rec = json.loads(f.read_text())
            except ValueError:
                f.unlink()
                continue
            key = f"{rec['uid']}_{rec['container']}"
            p = Proc(rec)
            pod = by_uid.get(rec["uid"])
            if pod is None:
                if p.is_alive() and not rec.get("done"):
                    log(f"pod of pid {rec['pid']} is gone: killing it")
                    p.signal(signal.SIGTERM)
                    time.sleep(0.5)
                    p.signal(signal.SIGKILL)
                self.forget(key)
                continue
            self.procs[key] = p
            if rec["uid"] not in self.tails:
                lf = Path(rec["log"])
                cri = lf.with_suffix(".cri.log")
                cri.write_bytes(b"")
                self.tails[rec["uid"]] = [lf, cri, 0, time.time()]
            if rec.get("done"):
                continue
            if p.is_alive():
                log(f"re-adopted {rec['namespace']}/{rec['name']} [{rec['container']}] pid {rec['pid']}")
            # a finished one is reported by the next tick (exit file or 'lost')

    def list_pods(self) -> tuple[list[dict], str]:
        data = self.request("GET", "/api/v1/pods", timeout=60)
        return data["items"], data["metadata"]["resourceVersion"]

    def watch(self, rv: str) -> None:
        while not self.stop.is_set():
            try:
                resp = self._open("GET", "/api/v1/pods", query=[
                    ("watch", "true"), ("resourceVersion", rv), ("allowWatchBookmarks", "true"),
                    ("timeoutSeconds", "240")], timeout=300)
                with resp:
                    for line in resp:
                        if self.stop.is_set():
                            return
                        if not line.strip():
                            continue
                        ev = json.loads(line)
                        obj = ev.get("object") or {}
                        if ev["type"] == "ERROR":
                            if obj.get("code") == 410:
                                raise _Gone()
                            continue
                        rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                        if ev["type"] != "BOOKMARK":
                            self.events.put((ev["type"], obj))
            except _Gone:
                log("watch expired (410): relisting")
                items, rv = self.list_pods()
                self.events.put(("RELIST", items))
            except Exception as e:  # noqa: BLE001 - reconnect
                if self.stop.is_set():
                    return
                log(f"watch error: {e!r}; reconnecting")
                time.sleep(1)

    def run(self) -> None:
        items, rv = self.list_pods()
        self.adopt(items)
        for p in items:
            self.safe_reconcile(p)
        threading.Thread(target=self.watch, args=(rv,), daemon=True).start()
        log(f"running: {len(items)} pods listed, {len(self.procs)} records adopted")
        while not self.stop.is_set():
            try:
                kind, obj = self.events.get(timeout=0.2)
                if kind == "RELIST":
                    live = {p["metadata"]["uid"] for p in obj}
                    for uid in list(self.pods):
                        if uid not in live:
                            self.safe_reconcile(self.pods[uid], deleted=True)
                    for p in obj:
                        self.safe_reconcile(p)
                else:
                    self.safe_reconcile(obj, deleted=(kind == "DELETED"))
            except queue.Empty:
                pass
            try:
                self.tick()
            except Exception:  # noqa: BLE001
                log("tick failed:\n" + traceback.format_exc())

    def safe_reconcile(self, pod: dict, deleted: bool = False) -> None:
        try:
            self.reconcile(pod, deleted)
        except Exception:  # noqa: BLE001 - one bad pod must not stop the runner
            md = pod.get("metadata", {})
            log(f"reconcile {md.get('namespace')}/{md.get('name')} failed:\n{traceback.format_exc()}")


class _Gone(Exception):
    pass


class ApiError(Exception):
    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


def expand(s: str, env: dict[str, str]) -> str:
    """Kubernetes $(VAR) expansion; $$(VAR) escapes."""
    def rep(m: re.Match) -> str:
        if m.group(0).startswith("$$"):
            return m.group(0)[1:]
        return env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$?\(([A-Za-z_][A-Za-z0-9_.-]*)\)", rep, s)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--state", required=True)
    a = ap.parse_args()
    r = Runner(a.kubeconfig, Path(a.state))

    def _stop(*_):
        r.stop.set()
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    r.run()
    log("stopped (pod processes keep running; they are re-adopted on the next start)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
