"""Checkpoints without a shared filesystem: find them, copy them, keep a replica, place them.

When ``--checkpoint-dir`` is host-local, the newest complete checkpoint that
rank 0 wrote lives on one host only. Before every restart the keeper
(:mod:`corral.recovery.keeper`) calls :func:`place_latest` for the next
attempt's world: the checkpoints of every host and of the coordinator's
:class:`Replica` are listed (:mod:`.survey`), the newest *complete* one is
chosen (a checkpoint being written when the failure hit is a hidden temp file,
or fails the completeness check, and is never chosen) and copied to every host
that lacks it (:mod:`.placement`, :mod:`.transfer`), so whichever host becomes
rank 0 resumes from it. With ``--replicate-checkpoints`` every announced
checkpoint is also pulled into the replica while the job runs (:mod:`.replica`).

Everything on the hosts runs :mod:`.hostside` (standard library only) through
:mod:`corral.remote.python`, over any :class:`~corral.transport.base.Transport`;
on ``local:N`` the same code runs as local processes.
"""

from __future__ import annotations

from corral.recovery.checkpoints.common import (
    HOSTSIDE,
    REPLICA_SOURCE,
    SHIPPED,
    CheckpointTransferError,
)
from corral.recovery.checkpoints.placement import (
    CheckpointPlacement,
    WorldPlacement,
    ensure_latest_on,
    place_latest,
)
from corral.recovery.checkpoints.replica import PullResult, Replica
from corral.recovery.checkpoints.survey import CheckpointFile, HostCheckpoints, survey
from corral.recovery.checkpoints.transfer import CopyResult, copy_checkpoint, copy_to_many

__all__ = [
    "HOSTSIDE",
    "REPLICA_SOURCE",
    "SHIPPED",
    "CheckpointFile",
    "CheckpointPlacement",
    "CheckpointTransferError",
    "CopyResult",
    "HostCheckpoints",
    "PullResult",
    "Replica",
    "WorldPlacement",
    "copy_checkpoint",
    "copy_to_many",
    "ensure_latest_on",
    "place_latest",
    "survey",
]
