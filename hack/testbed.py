#!/usr/bin/env python3
"""The test bed's command line: `python hack/testbed.py up|down|status|restart|kubeconfig|env|
kwok-config|kuberay on|off|kueue on|off` (hack.bed.cli lists them; docs/testbed.md).

The bed itself is the package hack.bed, one module a part; this file stays as the command's path
(Makefile, CI, docs).
"""

from __future__ import annotations

import sys

from hack.bed.cli import main  # `hack` is installed with the project (pyproject.toml)

if __name__ == "__main__":
    sys.exit(main())
