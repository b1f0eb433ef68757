"""Quorum ids that stay unique when torchft's Lighthouse restarts.

A Lighthouse numbers its quorums from 1, and one that corral restarts (same address,
same port: :mod:`corral.recovery.lighthouse`) starts again from 1. torchft's Manager
keys everything about a quorum by that number: it reconfigures its process group only
when the number differs from the one it is configured for, and the process group
rendezvous under ``torchft/<number>`` in the first participant's store
(``torchft.process_group._rendezvous``), a store that lives as long as that process.
So after a restart

- a group whose last quorum had the number the new Lighthouse gives a *different*
  set of groups does not reconfigure while the others do: they wait for it until the
  process-group timeout (``Gloo connectFullMesh failed ... Connect timeout``);
- groups that do reconfigure can read the old quorum's keys, the gloo addresses of a
  process group that was torn down since ("Connection refused").

Both cost the process-group timeout (30 s by default) before a commit failure makes
the Lighthouse issue another quorum. torchft itself is not changed: corral's process
group (:func:`reconfigurable`) tells the peers, in the reconfigure handle every
participant already sends with its quorum request, which configuration it is in; and
the Manager's client (:func:`unique_quorum_ids`) hands the Manager, instead of the
Lighthouse's number, :func:`configuration_id`: the configuration the participants
share when they all share one made for this very quorum (nothing to do), else a new id
(a 63-bit digest of the Lighthouse's number and every participant's handle and
configuration), the same on every participant because it is computed from the same
reply. A configuration made under an earlier Lighthouse is never that of the new
quorum, so a restart reconfigures every group under a key no store has seen.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

__all__ = ["CONFIG_KEY", "configuration_id", "reconfigurable", "unique_quorum_ids"]

CONFIG_KEY = "corral_configured"
"""The reconfigure handle's field that names the configuration its process group is in:
``[lighthouse_quorum_id, participants, configuration_id]``, or null when it has none
(not configured yet, or its last reconfiguration failed)."""

_ID_MASK = (1 << 63) - 1


def _parsed(handles: Sequence[str]) -> tuple[list[str], list[Any]] | None:
    """Each handle's process-group id and configuration; None when a handle is not
    one of torchft's JSON handles (another process-group class: ids left as they are)."""
    ids: list[str] = []
    configured: list[Any] = []
    for handle in handles:
        try:
            fields = json.loads(handle)
        except (TypeError, ValueError):
            return None
        if not isinstance(fields, dict):
            return None
        ids.append(str(fields.get("id")))
        configured.append(fields.get(CONFIG_KEY))
    return ids, configured


def configuration_id(quorum_id: int, handles: Sequence[str]) -> int:
    """The id the Manager is given for a Lighthouse quorum ``quorum_id`` whose
    participants sent ``handles`` (the reply's ``reconfigure_handles``, the same list
    on every participant): the configuration they all share when it was made for
    this quorum (same Lighthouse number, same number of participants: the Manager
    keeps its process group), else a new one."""
    parsed = _parsed(handles)
    if parsed is None or not handles:
        return quorum_id
    ids, configured = parsed
    shared = configured[0]
    if (
        isinstance(shared, list)
        and len(shared) == 3
        and all(c == shared for c in configured)
        and shared[0] == quorum_id
        and shared[1] == len(handles)
    ):
        return int(shared[2])
    text = json.dumps([quorum_id, ids, configured], separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "big") & _ID_MASK


def reconfigurable(base: Any) -> Any:
    """torchft's process-group class ``base`` (``ProcessGroupGloo``,
    ``ProcessGroupBabyNCCL``) whose reconfigure handle carries the configuration it is
    in (:data:`CONFIG_KEY`), set by a successful ``reconfigure``."""

    class _Configured(base):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.corral_configured: list[int] | None = None
            # configuration id -> (Lighthouse quorum id, participants), from the client
            self.corral_issued: dict[int, tuple[int, int]] = {}

        def get_reconfigure_handle(self) -> str:
            handle = super().get_reconfigure_handle()
            try:
                fields = json.loads(handle)
            except (TypeError, ValueError):
                return str(handle)
            fields[CONFIG_KEY] = self.corral_configured
            return json.dumps(fields)

        def reconfigure(self, opts: Any) -> Any:
            issued = self.corral_issued.pop(int(opts.uuid), None)
            self.corral_issued.clear()
            self.corral_configured = None  # until it succeeds
            work = super().reconfigure(opts)
            if issued is not None:
                self.corral_configured = [issued[0], issued[1], int(opts.uuid)]
            return work

    _Configured.__name__ = _Configured.__qualname__ = f"Corral{base.__name__}"
    return _Configured


class _Reply:
    """A Manager client's quorum reply with its ``quorum_id`` replaced."""

    def __init__(self, reply: Any, quorum_id: int) -> None:
        self._reply = reply
        self.quorum_id = quorum_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reply, name)


class _Client:
    """torchft's ``ManagerClient`` whose quorum replies carry :func:`configuration_id`."""

    def __init__(self, client: Any, pg: Any) -> None:
        self._client = client
        self._pg = pg

    def _quorum(self, *args: Any, **kwargs: Any) -> Any:
        reply = self._client._quorum(*args, **kwargs)
        handles = list(reply.reconfigure_handles)
        issued = configuration_id(int(reply.quorum_id), handles)
        self._pg.corral_issued[issued] = (int(reply.quorum_id), len(handles))
        return _Reply(reply, issued)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def unique_quorum_ids(manager: Any) -> bool:
    """Give ``manager`` (a torchft Manager over a :func:`reconfigurable` process
    group) :func:`configuration_id` for its quorums; False (left as it is) when this
    torchft's Manager has no client or process group where this one has them."""
    client, pg = getattr(manager, "_client", None), getattr(manager, "_pg", None)
    if client is None or not hasattr(client, "_quorum") or not hasattr(pg, "corral_issued"):
        return False
    manager._client = _Client(client, pg)
    return True
