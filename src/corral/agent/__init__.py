"""The node agent: supervises one node's processes on its host.

The coordinator starts ``python -m corral.agent`` on every node (as a local
process for ``local:N``, over SSH otherwise) and talks to it with the frames of
:mod:`corral.agent.protocol`. The agent starts the node's processes in their
own process group, streams their output, keeps host-side log files, records
every process group it owns, and tears them all down when asked, when its
stdin closes or when the coordinator's heartbeats stop.

Submodules are imported explicitly (``corral.agent.node``,
``corral.agent.worker``): the rank wrapper must stay cheap to import.
"""
