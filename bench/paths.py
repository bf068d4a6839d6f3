"""Where the benchmarks read and write. They run from a checkout, installed editable (`pip install -e
'.[bench]'`, as hack/setup.sh does): the examples, docs and operator sources they read sit beside them.

    DATA     bench/data/      inputs: published step times, measured runs (committed)
    RESULTS  bench/results/   the tuner benchmark's results JSON (committed)
    STATE    .state/bench/    caches and logs (git-ignored; rebuilt when absent)
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / "data"
RESULTS = ROOT / "bench" / "results"
STATE = ROOT / ".state" / "bench"


def hack_module(name: str) -> ModuleType:
    """hack/<name>.py, imported under its own name. hack/ holds scripts, not a package (they import one
    another by bare name, as `python hack/demo.py` puts hack/ first on the path), so each is loaded
    from its file and registered in sys.modules, where the others' bare imports find it."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "hack" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
    return mod
