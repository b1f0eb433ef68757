"""Entry point: ``python -m corral.agent`` (reads its start message from stdin)."""

from __future__ import annotations

import sys

from corral.agent.node import main

if __name__ == "__main__":
    sys.exit(main())
