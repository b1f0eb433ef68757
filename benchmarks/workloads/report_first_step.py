"""Dispatch workload: report step 1 at once, print one line, exit (no torch).

``python report_first_step.py``: ``corral.sdk.report(1, total=1)`` (a progress
event for the supervisor), then ``first step rank R`` on stdout.
"""

from __future__ import annotations

import os
import sys

from corral.sdk import report


def main() -> int:
    """Report step 1 and say so."""
    report(1, total=1)
    print(f"first step rank {os.environ.get('RANK', '?')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
