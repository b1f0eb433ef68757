"""Which transport a cluster needs: local processes for ``local:N``, SSH otherwise."""

from __future__ import annotations

from corral.cluster.model import Cluster
from corral.errors import ConfigError
from corral.transport.base import Transport
from corral.transport.options import SshOptions


def transport_for(
    cluster: Cluster,
    ssh: SshOptions,
    *,
    connect_timeout: float | None = None,
    max_concurrency: int = 64,
) -> Transport:
    """LocalTransport for ``local:N``, else an SshTransport for the CLUSTER options
    (ConfigError for a cluster that mixes both)."""
    if cluster.is_local:
        from corral.transport.local import LocalTransport

        return LocalTransport()
    if any(h.local for h in cluster.hosts):
        raise ConfigError("a cluster cannot mix local:N nodes and SSH hosts", option="--hosts")
    from corral.transport.ssh import SshTransport

    return SshTransport(ssh, connect_timeout=connect_timeout, max_concurrency=max_concurrency)
