"""Parse the ``--hosts`` value and hostfiles into a :class:`Cluster`.

Accepted forms (see DESIGN.md §4):

* ``local:N`` — N simulated nodes on this machine;
* ``h1,h2:4,gpu[01-04]:8`` — a comma list (when it is not an existing file);
* ``node1`` / ``user@node1:8`` — one host, when no such file exists and the value
  does not look like a path (see :func:`looks_like_path`);
* a file, auto-detected as one of

  - a text hostfile, one host per line, formats freely mixed::

        node1.example.com:4                 # host[:slots]
        node2 slots=8                       # DeepSpeed / Horovod style
        ml@node3:8 port=2222 interface=eth1 # extra keys, user@ prefix
        gpu[01-04]:8 label.rack=a env.NCCL_DEBUG=INFO   # Slurm ranges

  - a YAML cluster file (``.yaml``/``.yml``, or text starting with ``hosts:``)
    with a ``hosts:`` list and optional ``defaults:``;
  - an MLX JSON hostfile (``[{"ssh": "h1", "ips": ["10.0.0.1"]}]`` or the
    newer ``{"backend": ..., "envs": [...], "hosts": [...]}``).

Every problem is a :class:`~corral.errors.ConfigError` naming ``file:line``
(or the ``--hosts`` option), saying what is wrong and what is expected.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Literal

from corral.cluster._text import (
    _DIGITS_RE,
    _OPTION,
    HOSTFILE_KEYS,
    MAX_HOSTS,
    expand_hostlist,
    parse_host_list,
    parse_hostfile_text,
)
from corral.cluster.model import LOCAL_ADDRESS, Cluster, Host
from corral.errors import ConfigError

__all__ = [
    "HOSTFILE_KEYS",
    "MAX_HOSTS",
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

HostfileFormat = Literal["text", "yaml", "json"]

_HOSTFILE_SUFFIXES = (".txt", ".yaml", ".yml", ".json", ".hosts")
_YAML_START_RE = re.compile(r"^(hosts|defaults)\s*:(\s|$)")


def local_cluster(count: int) -> Cluster:
    """``count`` simulated nodes ``local-0``.. on this machine (``local:N``)."""
    if count < 1 or count > MAX_HOSTS:
        raise ConfigError(
            f"invalid node count {count}: expected local:N with N from 1 to {MAX_HOSTS}",
            option=_OPTION,
        )
    hosts = tuple(
        Host(name=f"local-{i}", address=LOCAL_ADDRESS, slots=1, local=True) for i in range(count)
    )
    return Cluster(hosts=hosts, source=f"local:{count}")


# --------------------------------------------------------------------------- YAML and MLX JSON
# The parsers need pydantic and PyYAML (slow to import), so they live in
# corral.cluster._structured and are imported only when such a file is parsed.


def parse_yaml_cluster(text: str, source: str = "<yaml>") -> Cluster:
    """Parse a YAML cluster file: ``hosts:`` (lines or mappings) and optional ``defaults:``."""
    from corral.cluster import _structured

    return _structured.parse_yaml_cluster(text, source)


def parse_mlx_hostfile(text: str, source: str = "<json>") -> Cluster:
    """Parse an MLX JSON hostfile: name = ``ssh``, address = first of ``ips``.

    Both the list form and the ``{"backend", "envs", "hosts"}`` form are accepted;
    ``envs`` (``"NAME=value"`` strings) go into every host's env. An optional
    ``slots`` key per host is a corral extension (default 1).
    """
    from corral.cluster import _structured

    return _structured.parse_mlx_hostfile(text, source)


# --------------------------------------------------------------------------- files and --hosts


def detect_format(text: str, path: str | Path | None = None) -> HostfileFormat:
    """Which parser a hostfile needs: by extension, else by content.

    ``.yaml``/``.yml`` and text whose first line (after comments) starts with
    ``hosts:`` or ``defaults:`` (or a YAML ``---``) are YAML; ``.json`` and text
    that parses as a JSON list (or starts with ``[``/``{``) are MLX JSON; anything
    else is a text hostfile.
    """
    suffix = Path(path).suffix.lower() if path is not None else ""
    if suffix in (".yaml", ".yml"):
        return "yaml"
    if suffix == ".json":
        return "json"
    stripped = text.lstrip()
    if stripped.startswith(("[", "{")):
        return "json"
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line == "---" or line.startswith("%YAML") or _YAML_START_RE.match(line):
            return "yaml"
        break
    return "text"


def _with_ssh_defaults(cluster: Cluster, user: str | None, port: int | None) -> Cluster:
    if user is None and port is None:
        return cluster
    hosts = tuple(
        h
        if h.local
        else dataclasses.replace(
            h,
            user=h.user if h.user is not None else user,
            port=h.port if h.port is not None else port,
        )
        for h in cluster.hosts
    )
    return Cluster(hosts=hosts, source=cluster.source)


def load_cluster_file(path: str | Path) -> Cluster:
    """Read and parse a hostfile of any supported format (auto-detected)."""
    source = str(path)
    file_path = Path(path).expanduser()
    if not file_path.exists():
        raise ConfigError(f"hostfile {source!r} not found: expected an existing file")
    if file_path.is_dir():
        raise ConfigError(f"hostfile {source!r} is a directory: expected a file")
    try:
        text = file_path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read hostfile ({exc}): expected a readable UTF-8 file", source=source
        ) from None
    fmt = detect_format(text, file_path)
    if fmt == "yaml":
        return parse_yaml_cluster(text, source)
    if fmt == "json":
        return parse_mlx_hostfile(text, source)
    return parse_hostfile_text(text, source)


def load_cluster(spec: str, *, ssh_user: str | None = None, ssh_port: int | None = None) -> Cluster:
    """The cluster named by a ``--hosts`` value: ``local:N``, a file path or ``h1,h2,...``.

    ``ssh_user``/``ssh_port`` (``--ssh-user``/``--ssh-port``) fill in hosts that
    do not set their own; they do not apply to ``local:N`` nodes.
    """
    spec = spec.strip()
    if not spec:
        raise ConfigError(
            "empty value: expected a hostfile path, local:N or h1,h2,...", option=_OPTION
        )
    if ssh_port is not None and not 1 <= ssh_port <= 65535:
        raise ConfigError(
            f"invalid port {ssh_port}: expected an integer from 1 to 65535", option="--ssh-port"
        )
    if ssh_user is not None and not ssh_user.strip():
        raise ConfigError("empty user: expected a user name", option="--ssh-user")
    if spec.startswith("local:"):
        count = spec.removeprefix("local:").strip()
        if not _DIGITS_RE.match(count):
            raise ConfigError(
                f"invalid {spec!r}: expected local:N with N an integer >= 1 (e.g. local:4)",
                option=_OPTION,
            )
        return local_cluster(int(count))
    path = Path(spec).expanduser()
    if path.exists():
        cluster = load_cluster_file(spec)
    elif "," in spec or not looks_like_path(spec):
        cluster = parse_host_list(spec)
    else:
        raise ConfigError(
            f"hostfile {spec!r} not found: expected an existing file, local:N or a "
            "comma-separated host list such as 'node1,node2' (or one host name)",
            option=_OPTION,
        )
    return _with_ssh_defaults(cluster, ssh_user, ssh_port)


def looks_like_path(spec: str) -> bool:
    """Whether a ``--hosts`` value that names no file was meant as one (a ``/``, a
    leading ``~`` or ``.``, or a hostfile suffix) rather than as one host."""
    return "/" in spec or spec.startswith(("~", ".")) or spec.lower().endswith(_HOSTFILE_SUFFIXES)
