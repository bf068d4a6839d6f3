"""Prometheus scrape targets for the pod runner's pods (file_sd; the bed has no kubernetes_sd).

A pod annotated prometheus.io/scrape=true gets <podIP>:<prometheus.io/port> (path
prometheus.io/path) in .state/bed/prometheus/targets/<ns>_<name>.json while it runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path


class ScrapeTargets:
    def __init__(self, targets: Path):
        self.dir = targets
        targets.mkdir(parents=True, exist_ok=True)

    def _file(self, pod: dict) -> Path:
        md = pod["metadata"]
        return self.dir / f"{md['namespace']}_{md['name']}.json"

    def write(self, pod: dict) -> None:
        md = pod["metadata"]
        ann = md.get("annotations") or {}
        if ann.get("prometheus.io/scrape") != "true" or not ann.get("prometheus.io/port"):
            return
        f = self._file(pod)
        if f.exists():
            return
        labels = {
            "namespace": md["namespace"],
            "pod": md["name"],
            "__metrics_path__": ann.get("prometheus.io/path", "/metrics"),
        }
        for k, v in (md.get("labels") or {}).items():
            labels["pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", k)] = v
        tmp = f.with_suffix(".tmp")
        tmp.write_text(
            json.dumps([{"targets": [f"{pod['status']['podIP']}:{ann['prometheus.io/port']}"], "labels": labels}])
        )
        tmp.replace(f)

    def remove(self, pod: dict) -> None:
        self._file(pod).unlink(missing_ok=True)
