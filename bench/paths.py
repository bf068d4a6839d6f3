"""Where the benchmarks read and write. They run from a checkout, installed editable (`pip install -e
'.[bench]'`, as hack/setup.sh does): the examples, docs and operator sources they read sit beside them.

    DATA     bench/data/      inputs: published step times, measured runs (committed)
    RESULTS  bench/results/   the tuner benchmark's results JSON (committed)
    STATE    .state/bench/    caches and logs (git-ignored; rebuilt when absent)
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / "data"
RESULTS = ROOT / "bench" / "results"
STATE = ROOT / ".state" / "bench"
