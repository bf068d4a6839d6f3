"""The API's clock: timestamps as the API server writes them."""

from __future__ import annotations

from datetime import UTC, datetime


def now_iso() -> str:
    """A timestamp as the API server writes them (seconds, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
