"""Trial backends for the tuning loop outside Kubernetes (the operator has its own pod backend)."""

from .local import LocalBackend

__all__ = ["LocalBackend"]
