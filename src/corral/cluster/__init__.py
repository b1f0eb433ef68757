"""Where a job runs: :class:`Host`, :class:`Cluster` and the hostfile parsers.

``load_cluster(spec)`` turns a ``--hosts`` value (``local:N``, ``h1,h2,...``, one
host name or a text/YAML/MLX-JSON hostfile) into a :class:`Cluster`; every problem is a
:class:`~corral.errors.ConfigError` naming ``file:line`` or the option.
"""

from __future__ import annotations

from corral.cluster.hostfile import (
    HOSTFILE_KEYS,
    MAX_HOSTS,
    HostfileFormat,
    detect_format,
    expand_hostlist,
    load_cluster,
    load_cluster_file,
    local_cluster,
    parse_host_list,
    parse_hostfile_text,
    parse_mlx_hostfile,
    parse_yaml_cluster,
)
from corral.cluster.model import LOCAL_ADDRESS, Cluster, Host

__all__ = [
    "HOSTFILE_KEYS",
    "LOCAL_ADDRESS",
    "MAX_HOSTS",
    "Cluster",
    "Host",
    "HostfileFormat",
    "detect_format",
    "expand_hostlist",
    "load_cluster",
    "load_cluster_file",
    "local_cluster",
    "parse_host_list",
    "parse_hostfile_text",
    "parse_mlx_hostfile",
    "parse_yaml_cluster",
]
