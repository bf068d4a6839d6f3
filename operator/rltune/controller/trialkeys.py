"""The operator's secret and the per-trial keys derived from it (api/metrics.py 'Signed').

The secret is a file the chart mounts from a Secret it generates once per release
(`metricsKeyFile`; the operator never reads Secrets through the API). A trial's key is derived from
it, the job's UID and the trial id, given to that trial's pods in env RLTUNE_METRICS_KEY and never
stored: a restarted operator derives the same keys. Without the file the operator makes a secret
at start-up and says so in its log: trials that span a restart then fail their metrics check.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import Optional

from ..api.metrics import trial_key
from ..settings import OperatorSettings

log = logging.getLogger("rltune.controller")
MIN_KEY_BYTES = 16

_ephemeral: Optional[bytes] = None
_loaded: dict[str, bytes] = {}


class MetricsKeyError(RuntimeError):
    pass


def operator_key(settings: OperatorSettings) -> bytes:
    global _ephemeral
    path = settings.metrics_key_file
    if path:
        if path not in _loaded:
            try:
                raw = Path(path).read_bytes().strip()
            except OSError as e:
                raise MetricsKeyError(f"metricsKeyFile {path}: {e.strerror}") from None
            if len(raw) < MIN_KEY_BYTES:
                raise MetricsKeyError(
                    f"metricsKeyFile {path}: fewer than {MIN_KEY_BYTES} bytes; the chart generates 64"
                )
            _loaded[path] = raw
        return _loaded[path]
    if _ephemeral is None:
        _ephemeral = secrets.token_bytes(32)
        log.warning(
            "no metricsKeyFile: trial metrics are signed with a key made at start-up; trials running across a "
            "restart of the operator will fail their metrics check (the Helm chart sets one)"
        )
    return _ephemeral


def key_for(settings: OperatorSettings, namespace: str, job_uid: str, trial: str) -> str:
    return trial_key(operator_key(settings), namespace, job_uid, trial)
