"""The twin's failure type: a configuration that would fail on a real cluster."""


class Infeasible(Exception):
    """The configuration cannot run. `oom` marks CUDA out-of-memory failures (the pod is OOMKilled)."""

    def __init__(self, reason: str, oom: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.oom = oom or "out of memory" in reason.lower()

    def __str__(self) -> str:
        return self.reason
