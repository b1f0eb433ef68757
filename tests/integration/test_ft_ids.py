"""Quorum ids after a Lighthouse restart (corral.sdk._ftids), with two real torchft gloo
process groups in this process (one per replica group, as each group's rank 0 has):
the Manager's reconfigure decision and torchft's rendezvous run as they do in a job,
only the Lighthouse's replies are written out.

The scenario of ``test_a_killed_lighthouse_is_restarted_and_the_groups_train_on``'s
slow runs: the old Lighthouse issued quorum 1 = {A} then quorum 2 = {A, B}; the new one
issues quorum 1 = {B} then quorum 2 = {A, B}. With the Lighthouse's numbers A keeps
its process group at the new quorum 2 (the number it is configured for) while B
reconfigures alone and waits for it until the process-group timeout."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest

from corral.sdk._ftids import CONFIG_KEY, configuration_id, reconfigurable
from tests.conftest import require

pytestmark = pytest.mark.torch

TIMEOUT = timedelta(seconds=20)  # what B would wait for A without the fix


class Group:
    """One replica group's rank 0: its process group and what its Manager keeps (the
    id it is configured for), deciding as torchft's Manager does."""

    def __init__(self, torchft: Any, name: str) -> None:
        self.name = name
        self.pg = reconfigurable(torchft.ProcessGroupGloo)(timeout=TIMEOUT)
        self.quorum_id = -1  # torchft's Manager._quorum_id

    def handle(self) -> str:
        """What its quorum request sends (Manager._async_quorum)."""
        return str(self.pg.get_reconfigure_handle())

    def take(self, lighthouse_id: int, handles: list[str]) -> bool:
        """The reply of a quorum: reconfigure when its id changed (Manager._async_quorum,
        its client's reply as corral.sdk._ftids gives it); whether it reconfigured."""
        from torchft.process_group import ReconfigureOptions

        issued = configuration_id(lighthouse_id, handles)
        self.pg.corral_issued[issued] = (lighthouse_id, len(handles))
        if issued == self.quorum_id:
            return False
        self.quorum_id = issued
        opts = ReconfigureOptions()
        opts.uuid, opts.handles, opts.timeout = issued, handles, TIMEOUT
        self.pg.reconfigure(opts).wait()
        return True

    def allreduce(self, value: float) -> float:
        import torch
        from torch.distributed import AllreduceOptions

        tensor = torch.tensor([value])
        self.pg.allreduce([tensor], AllreduceOptions()).wait()  # a sum
        return float(tensor[0])


def _quorum(lighthouse_id: int, *groups: Group) -> list[bool]:
    """A quorum of ``groups`` (in the Lighthouse's order) with id ``lighthouse_id``:
    each requests it with its handle and takes the reply, together (a process group's
    rendezvous waits for all of them); whether each reconfigured."""
    handles = [g.handle() for g in groups]
    with ThreadPoolExecutor(len(groups)) as pool:
        return list(pool.map(lambda g: g.take(lighthouse_id, handles), groups))


def _together(*groups: Group) -> list[float]:
    with ThreadPoolExecutor(len(groups)) as pool:
        return list(pool.map(lambda g: g.allreduce(1.0), groups))


def test_after_a_lighthouse_restart_every_group_reconfigures_under_fresh_keys() -> None:
    torchft = require("torchft", "install the [ft] extra: make setup")
    a, b = Group(torchft, "A"), Group(torchft, "B")
    # the first Lighthouse: A alone, then both
    assert _quorum(1, a) == [True]
    assert _quorum(2, a, b) == [True, True]
    assert _together(a, b) == [2.0, 2.0]
    # a step later nothing changed: torchft's fast quorum, same number, nobody reconfigures
    assert _quorum(2, a, b) == [False, False]
    first = a.quorum_id
    # the Lighthouse restarts: B asks first and gets quorum 1 alone, then both get 2;
    # the Lighthouse's 2 again, but not the configuration A is in: A reconfigures too
    assert _quorum(1, b) == [True]
    assert _quorum(2, a, b) == [True, True]
    assert a.quorum_id == b.quorum_id != first
    assert _together(a, b) == [2.0, 2.0]
    assert _quorum(2, a, b) == [False, False]  # and the fast quorum keeps it


def test_a_reused_number_rendezvous_under_a_key_no_store_has_seen() -> None:
    # the new quorum 1 has the old quorum 1's number and a participant's store that
    # holds the old keys: the rendezvous prefix (torchft/<id>) differs
    torchft = require("torchft", "install the [ft] extra: make setup")
    from torchft.process_group import _rendezvous

    a, b = Group(torchft, "A"), Group(torchft, "B")
    old = [a.handle(), b.handle()]
    assert _quorum(1, a, b) == [True, True]
    used = {a.quorum_id}
    assert _quorum(2, b, a) == [True, True]
    used.add(a.quorum_id)
    new = [a.handle(), b.handle()]
    assert _quorum(1, a, b) == [True, True]  # the restarted Lighthouse's 1: same order
    assert a.quorum_id not in used and configuration_id(1, new) != configuration_id(1, old)

    def prefix(handles: list[str], issued: int) -> str:
        from torchft.process_group import ReconfigureOptions

        opts = ReconfigureOptions()
        opts.uuid, opts.handles = issued, handles
        return str(_rendezvous(opts, json.loads(handles[0])["id"]).store_addr)

    assert prefix(new, a.quorum_id) != prefix(old, configuration_id(1, old))
    assert _together(a, b) == [2.0, 2.0]
    assert json.loads(a.handle())[CONFIG_KEY] == [1, 2, a.quorum_id]
