"""Which container images the pod runner executes as local processes (hack/images.yaml), as globs
and as one regex: kwok's Stages leave those pods to the runner (hack.bed.kwok), and the runner
(hack.bed.kubelet.invoke) picks them out with the same translation."""

from __future__ import annotations

import re

from hack.bed import paths


def load() -> list[dict]:
    import yaml

    return yaml.safe_load((paths.HACK / "images.yaml").read_text())["images"]


def glob_to_regex(glob: str) -> str:
    """Translate an image glob (`*` any run, `?` one char) to a regex that Python's `re` and
    Go's `regexp` (kwok's jq `test`) read alike (fnmatch.translate emits atomic groups Go lacks)."""
    out = []
    for ch in glob:
        out.append(".*" if ch == "*" else "." if ch == "?" else re.escape(ch))
    return "".join(out)


def regex(images: list[dict] | None = None) -> str:
    """One anchored regex matching every mapped image glob."""
    pats = [glob_to_regex(g) for e in (images or load()) for g in e["match"]]
    return "^(?:" + "|".join(pats) + ")$"
