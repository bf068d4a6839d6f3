#!/usr/bin/env python3
"""Replay a recorded framework console log, line by line: a stand-in for a training run.

    python3 hack/replaylog.py tests/fixtures/logs/verl-0.9.1.log [--delay S] [--step-delay S]
        [--scale F] [--stderr] [--exit-code N] [--keep-header]

Prints the file to stdout unchanged (flushed per line), except that with --scale F every timing
value is multiplied by F (verl: timing_s/*, timing_per_token_ms/*, perf/time_per_step, the
fully-async rollouter/wait times, and perf/throughput divided by F; OpenRLHF: timing/*), written
back in the same notation (`41.2`, `np.float64(41.2)`), so a replay through the metrics bridge
(rltune.adapters.bridge) looks like a faster or slower configuration. --steps N stops after the
N-th step line (a shorter run). --delay sleeps after every
line, --step-delay after every step line. Leading `# ` lines are the fixture's header and are
skipped unless --keep-header. --exit-code ends with that status (a failing run).

Stdlib only: it runs in any image with a Python 3.
"""

from __future__ import annotations

import argparse
import re
import sys
import time

# a printed number, bare or as a numpy scalar's repr: "41.2", "np.float64(41.2)"
_VALUE = re.compile(r"^((?:np\.\w+\()?)([-+0-9.eE]+)(\)?)$")
# OpenRLHF: "'timing/x': value" items of a "Global step N: {...}" dict
_ORLHF_ITEM = re.compile(r"('timing/[^']+': )((?:np\.\w+\()?)([-+0-9.eE]+)(\)?)")

_VERL_SCALED = re.compile(
    r"^(timing_s/|timing_per_token_ms/|perf/time_per_step$|fully_async/total_wait_time$|"
    r"fully_async/rollouter/(active_time|version_time)$)"
)
_VERL_INVERSE = re.compile(r"^perf/throughput$")


def _fmt(old: str, value: float) -> str:
    if re.fullmatch(r"[-+]?\d+", old):  # an int stays an int (pprint/repr of int)
        return str(int(round(value)))
    return repr(float(value))


def scale_line(line: str, factor: float) -> str:
    """The line with its timing values multiplied by `factor` (same format)."""
    if factor == 1.0:
        return line
    body_at = line.find("step:")
    if body_at >= 0 and re.match(r"step:-?\d+( - |$)", line[body_at:]):
        head, body = line[:body_at], line[body_at:]

        parts = body.split(" - ")
        for i, part in enumerate(parts[1:], 1):
            key, _, value = part.rpartition(":")
            m = _VALUE.match(value)
            if not m or not key:
                continue
            if _VERL_SCALED.match(key):
                v = float(m.group(2)) * factor
            elif _VERL_INVERSE.match(key):
                v = float(m.group(2)) / factor
            else:
                continue
            parts[i] = f"{key}:{m.group(1)}{_fmt(m.group(2), v)}{m.group(3)}"
        return head + " - ".join(parts)
    if "Global step" in line:
        return _ORLHF_ITEM.sub(
            lambda m: f"{m.group(1)}{m.group(2)}{_fmt(m.group(3), float(m.group(3)) * factor)}{m.group(4)}", line
        )
    return line


def _is_step(line: str) -> bool:
    return bool(re.search(r"(^|\) )step:-?\d+ - .*timing_s/step:", line)) or "Global step" in line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--delay", type=float, default=0.0, help="seconds to sleep after every line")
    ap.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep after every step line")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every timing value by this factor")
    ap.add_argument("--stderr", action="store_true", help="print to stderr instead of stdout")
    ap.add_argument("--exit-code", type=int, default=0, help="exit with this status at the end")
    ap.add_argument("--keep-header", action="store_true", help="also print the fixture's leading '# ' lines")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many step lines (0: the whole file)")
    args = ap.parse_args(argv)
    seen = 0
    out = sys.stderr if args.stderr else sys.stdout
    header = not args.keep_header
    with open(args.file, encoding="utf-8", newline="") as f:
        for raw in f:
            if header and raw.startswith("# "):
                continue
            header = False
            end = "\n" if raw.endswith("\n") else ""
            line = raw[: len(raw) - len(end)]
            out.write(scale_line(line, args.scale) + end)
            out.flush()
            if args.delay:
                time.sleep(args.delay)
            if _is_step(line):
                seen += 1
                if args.step_delay:
                    time.sleep(args.step_delay)
                if args.steps and seen >= args.steps:
                    break
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
