"""The test bed's pod runner: a fake kubelet for the kwok nodes (`python -m hack.bed.kubelet`, started
by hack/testbed.py as the bed process `podrunner`).

kwok nodes have no kubelet: kwok only makes pods *look* Running. This runner executes the
containers of pods whose image is mapped in hack/images.yaml as local processes and reports their
fate back into the pod status, like a minimal kubelet:

* init containers: once kwok has made the pod Running (pod IP assigned), the pod's init containers
  run first, one after another to completion, as a kubelet runs them: the pod goes back to Pending
  with Initialized=False and initContainerStatuses (main containers waiting PodInitializing); an
  init container whose image is not mapped counts as completed at once (kwok's behaviour); a
  failing one is restarted with back-off (restartPolicy Always/OnFailure) or fails the pod (Never).
  Once all completed the pod is Running and Initialized, and the main containers start.
* probes (probes.py, run on a small thread pool from the tick): a main container with a
  readinessProbe or startupProbe is not ready until they pass (the others are ready once started);
  a failing livenessProbe or startupProbe kills the container, which restarts as restartPolicy says.
* start: once kwok has made the pod Running (pod IP assigned), each mapped container's
  command + args run as a process in its own session (process group), with the pod's env
  (values, downward-API fieldRefs, resourceFieldRefs, configMap/secret refs, envFrom), cwd = repo
  root, PYTHONPATH = operator/ + repo root, `python`/`python3` -> the repo's .venv/bin/python.
  Identity, volumes and names as a kubelet gives them (sandbox.py): the pod's volumes
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

One module a part: runner (the loop: list, watch, reconcile a pod, tick), api (API server calls),
process_table (the container processes and their records), status (the status writer), invoke (argv
and env), kubectl_logs (`kubectl logs`), scrape_targets (Prometheus file_sd), sandbox (volumes,
identity, names), probes (readiness, liveness and startup probes), clock and log; podnet/ is not a
module but the folder put on PYTHONPATH of `podNetwork` images (podnet/sitecustomize.py).
"""
