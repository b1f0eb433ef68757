"""Test job (standard library only): ranks in lockstep, as DDP ranks are. Each step
sleeps ``--base`` s inside ``sdk.section("compute")``, then waits for every rank at a
barrier over TCP on MASTER_ADDR:MASTER_PORT (a stand-in for gloo's all-reduce, rank 0
the hub) inside ``sdk.section("wait")``, then reports the step. Rank ``--slow-rank``
sleeps ``--delay`` s more from step ``--slow-from`` on, in the first attempt only, and
with ``--fail-at K`` exits 7 after step K (so corral restarts the job). Rank
``--hang-rank`` hangs in ``hang_forever`` at step ``--hang-at`` (its peers then wait
at the barrier, as in a collective). Rank 0 prints the workload weights each attempt
started with.

usage: lockstep.py [--steps N] [--base S] [--slow-rank R] [--slow-from K] [--delay S]
                   [--fail-at K] [--hang-rank R --hang-at K]
"""

import argparse
import socket
import sys
import time

from corral import sdk

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--base", type=float, default=0.03, help="compute seconds per step")
parser.add_argument("--slow-rank", type=int, default=-1)
parser.add_argument("--slow-from", type=int, default=0)
parser.add_argument("--delay", type=float, default=0.2)
parser.add_argument("--fail-at", type=int, default=0, help="0: the slow rank never fails")
parser.add_argument("--hang-rank", type=int, default=-1)
parser.add_argument("--hang-at", type=int, default=1, help="the step that hangs")
args = parser.parse_args()

me = sdk.info()
rank, world = me.rank, me.world_size
HELLO = b"lockstep rank "


def connect_peers() -> list[socket.socket]:
    """Rank 0: the other ranks' connections (a connection that does not say hello, as
    a readiness probe, is dropped); another rank: its one connection to rank 0."""
    if rank == 0:
        server = socket.create_server((me.master_addr, me.master_port))
        peers: list[socket.socket] = []
        while len(peers) < world - 1:
            peer, _ = server.accept()
            peer.settimeout(10)
            try:
                hello = peer.recv(len(HELLO) + 8)
            except OSError:
                hello = b""
            if hello.startswith(HELLO):
                peer.settimeout(None)
                peers.append(peer)
            else:
                peer.close()
        server.close()
        return peers
    for _ in range(1200):
        try:
            conn = socket.create_connection((me.master_addr, me.master_port), timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    else:
        sys.exit("rank 0 never listened")
    conn.settimeout(None)
    conn.sendall(HELLO + str(rank).encode())
    return [conn]


def barrier(peers: list[socket.socket]) -> None:
    """Every rank arrives before any leaves; a peer that vanished ends this rank as
    gloo does (exit 1)."""
    if rank == 0:
        for peer in peers:
            if not peer.recv(1):
                sys.exit("RuntimeError: Connection closed by peer")
        for peer in peers:
            peer.sendall(b"g")
    else:
        peers[0].sendall(b"s")
        if not peers[0].recv(1):
            sys.exit("RuntimeError: Connection closed by peer")


def hang_forever() -> None:
    """Stuck inside a step (what hang detection must find)."""
    while True:
        time.sleep(3600)


peers = connect_peers()
if rank == 0:
    weights = sdk.workload_weights() or ()
    print(f"attempt {me.attempt} weights " + ",".join(f"{w:.3f}" for w in weights), flush=True)
slow = me.attempt == 0 and rank == args.slow_rank
for step in range(args.steps):
    if rank == args.hang_rank and step + 1 == args.hang_at:
        print(f"rank {rank} hangs at step {step + 1}", flush=True)
        hang_forever()
    with sdk.section("compute"):
        time.sleep(args.base)
        if slow and step >= args.slow_from:
            if step == args.slow_from:
                print(f"delay starts at step {step + 1}", flush=True)
            time.sleep(args.delay)
    with sdk.section("wait"):
        barrier(peers)
    sdk.report(step + 1, args.steps)
    print(f"step {step + 1}", flush=True)
    if slow and step + 1 == args.fail_at:
        print(f"rank {rank} fails at step {step + 1}", flush=True)
        sys.exit(7)
barrier(peers)
