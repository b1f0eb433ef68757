"""Test job: a script written the way torchft's own examples run (no corral import).

It reads torchft's conventional variables, as torchft's ``train_ddp.py`` does, and
shards a toy data set by its replica group id; it prints what it read and its shard.
"""

import os

REPLICA_GROUP_ID = int(os.environ.get("REPLICA_GROUP_ID", 0))
NUM_REPLICA_GROUPS = int(os.environ.get("NUM_REPLICA_GROUPS", 2))
LIGHTHOUSE = os.environ.get("TORCHFT_LIGHTHOUSE", "")
shard = list(range(12))[REPLICA_GROUP_ID::NUM_REPLICA_GROUPS]
print(
    f"torchft env: group {REPLICA_GROUP_ID} of {NUM_REPLICA_GROUPS}, "
    f"lighthouse {LIGHTHOUSE.split(':')[0] or 'unset'}, shard {shard}",
    flush=True,
)
