"""``corral serve user ...`` reads the server's token file and store without loading
the web server (FastAPI): the token file is read by :mod:`corral.service.tokenfile`."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import corral

PROBE = """
import json, sys
from corral.cli.entry import main
sys.argv = ["corral", "serve", "user", "list", "--db", %r, "--token-file", %r]
try:
    main()
except SystemExit as exc:
    code = exc.code
print("SEEN " + json.dumps([code, "fastapi" in sys.modules, "starlette" in sys.modules]))
"""


def test_serve_user_list_loads_no_web_server(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    db = f"sqlite:///{tmp_path / 'corral.db'}"
    done = subprocess.run(
        [sys.executable, "-c", PROBE % (db, str(token_file))],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(corral.__file__).parents[1])},
    )
    [line] = [x for x in done.stdout.splitlines() if x.startswith("SEEN ")]
    assert json.loads(line[5:]) == [0, False, False], done.stdout + done.stderr
    # the token was made on first use, private to its owner
    assert len(token_file.read_text().strip()) >= 43
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
