"""Test job (two ranks, standard library only): rank 1 SIGKILLs itself while rank 0
waits on it over a socket (a stand-in for a collective); rank 0 notices its peer
vanish and exits 1 with gloo's words. Rank 1 is the root cause, rank 0 a symptom."""

import os
import signal
import socket
import sys
import time

rank = int(os.environ["RANK"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
if rank == 0:
    server = socket.create_server((addr, port))
    while True:  # corral's readiness probe connects too: wait for rank 1's hello
        peer, where = server.accept()
        if peer.recv(2) == b"r1":
            break
        peer.close()
    peer.sendall(b"go")
    if not peer.recv(1):  # the peer's end closed: it died
        print(f"RuntimeError: Connection closed by peer [{where[0]}]:{where[1]}", file=sys.stderr)
        sys.exit(1)
else:
    for _ in range(600):
        try:
            conn = socket.create_connection((addr, port), timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    else:
        sys.exit("rank 0 never listened")
    conn.sendall(b"r1")
    conn.recv(2)
    os.kill(os.getpid(), signal.SIGKILL)
