#!/usr/bin/env python3
"""A stand-in for OpenSSH's ``ssh`` that runs the remote command on this machine.

``fake_ssh.py [OPTIONS] -G HOST`` prints a minimal ``ssh -G`` answer;
``fake_ssh.py [OPTIONS] HOST COMMAND...`` appends its argv (JSON) to
``$FAKE_SSH_LOG`` and runs ``COMMAND`` with ``sh -c`` (what sshd does), unless
HOST is listed in ``$FAKE_SSH_DOWN`` (comma-separated): then it fails like an
unreachable host (exit 255). With ``$FAKE_SSH_HOMES`` set, each host's command
runs in its own home ``$FAKE_SSH_HOMES/HOST`` (so relative paths differ per host);
``$FAKE_SSH_SLEEP`` seconds pass before it does.
"""

from __future__ import annotations

import json
import os
import sys
import time

WITH_VALUE = set("BbcDEeFIiJLlmOoPpQRSWw")


def main(argv: list[str]) -> int:
    i, resolve = 0, False
    while i < len(argv) and argv[i].startswith("-"):
        flag = argv[i]
        if flag == "-G":
            resolve = True
        elif flag[1:2] in WITH_VALUE and len(flag) == 2:
            i += 1
        i += 1
    host, command = argv[i], argv[i + 1 :]
    if resolve:
        timeout = os.environ.get("FAKE_SSH_TIMEOUT", "none")
        print(f"hostname {host}\nport 22\nconnecttimeout {timeout}")
        return 0
    log = os.environ.get("FAKE_SSH_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write(json.dumps(argv) + "\n")
    if host in os.environ.get("FAKE_SSH_DOWN", "").split(","):
        print(f"ssh: connect to host {host} port 22: Connection refused", file=sys.stderr)
        return 255
    time.sleep(float(os.environ.get("FAKE_SSH_SLEEP", "0")))
    homes = os.environ.get("FAKE_SSH_HOMES")
    if homes:
        home = os.path.join(homes, host)
        os.makedirs(home, exist_ok=True)
        os.chdir(home)
        os.environ["HOME"] = home
    os.execvp("sh", ["sh", "-c", " ".join(command)])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
