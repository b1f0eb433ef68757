"""The OpenSSH command line ``corral sync`` gives rsync (``rsync -e``).

It mirrors the settings of corral's own SSH transport: the ssh config
(``--ssh-config FILE`` as ``-F``, else ``~/.ssh/config``; Host aliases,
HostName, ProxyJump, UserKnownHostsFile come from it), the port and user
(per host from the hostfile, else the CLUSTER options), ``--ssh-key`` (with
IdentitiesOnly), strict host-key checking (``accept-new`` with
``--accept-new-host-keys``, never ``no``), keepalives that declare a silent
host lost after 15 s, and the ssh config's ConnectTimeout, else 10 s.

Algorithms (measured, see ``docs/sync.md``): where the ssh config leaves
KexAlgorithms or Ciphers at OpenSSH's built-in lists, those lists are only
reordered, never shortened. Key exchange puts first what corral's own transport
(asyncssh) prefers: the ML-KEM hybrid, then curve25519 (OpenSSH 9.0-9.8 start
with the sntrup761 hybrid, whose key generation costs the client about 0.15 s of
CPU per connection). Ciphers put AES-GCM first when this CPU has AES
instructions (a third less CPU per byte than chacha20-poly1305 here).

A password (``--ssh-password-env VAR``) never appears on a command line or in
a file: ssh asks an *askpass* helper, a two-line shell script that prints
``$VAR``, which ssh's environment (ours) already holds.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from corral.cluster.model import Host
from corral.contract import is_env_name
from corral.errors import ConfigError
from corral.sync.procs import communicate
from corral.transport.options import SshOptions

__all__ = [
    "FAST_CIPHERS",
    "FAST_KEX",
    "KEEPALIVE_COUNT",
    "KEEPALIVE_INTERVAL",
    "Resolved",
    "askpass_env",
    "builtin_algorithms",
    "has_hw_aes",
    "parse_ssh_g",
    "remote_target",
    "reorder",
    "resolve_host",
    "rsh_command",
    "rsync_quote",
    "ssh_argv",
    "tuning_options",
    "write_askpass",
]

KEEPALIVE_INTERVAL = 5
KEEPALIVE_COUNT = 3


def rsync_quote(arg: str) -> str:
    """Quote one word for rsync's ``-e`` parser (spaces split words; inside single
    quotes a doubled ``''`` is a literal quote; backslashes are not special)."""
    if arg and not re.search(r"[\s'\"]", arg):
        return arg
    return "'" + arg.replace("'", "''") + "'"


def rsh_command(argv: Sequence[str]) -> str:
    """``argv`` as one ``rsync -e`` string."""
    return " ".join(rsync_quote(a) for a in argv)


def _seconds(value: float) -> str:
    return str(max(1, round(value)))


def ssh_argv(
    options: SshOptions,
    host: Host,
    *,
    connect_timeout: float | None = None,
    password: bool = False,
    tuning: Sequence[str] = (),
    ssh: str = "ssh",
) -> list[str]:
    """The ssh command (without the destination) that reaches ``host``.

    ``connect_timeout`` None leaves the timeout to the ssh config (see
    :func:`resolve_host`, which tells whether it sets one); ``password`` means
    the askpass environment of :func:`askpass_env` is in place; ``tuning`` are
    extra ``-o`` options (see :func:`tuning_options`).
    """
    argv = [ssh]
    if options.config is not None:
        config = Path(options.config).expanduser()
        if not config.is_file():
            raise ConfigError(
                f"ssh config {options.config!r} not found: expected an OpenSSH client config file",
                option="--ssh-config",
            )
        argv += ["-F", str(config)]
    port = host.port or options.port
    if port:
        argv += ["-p", str(port)]
    user = host.user or options.user
    if user:
        argv += ["-l", user]
    if options.key is not None:
        key = Path(options.key).expanduser()
        if not key.is_file():
            raise ConfigError(f"key file {options.key!r} not found", option="--ssh-key")
        argv += ["-i", str(key), "-o", "IdentitiesOnly=yes"]
    if password:
        argv += ["-o", "BatchMode=no", "-o", "NumberOfPasswordPrompts=1"]
    else:
        argv += ["-o", "BatchMode=yes"]
    if options.insecure_no_host_key_check:  # asked for explicitly (insecure)
        argv += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    else:
        checking = "accept-new" if options.accept_new_host_keys else "yes"
        argv += ["-o", f"StrictHostKeyChecking={checking}"]
    if connect_timeout is not None:
        argv += ["-o", f"ConnectTimeout={_seconds(connect_timeout)}"]
    argv += tuning
    argv += [
        "-o",
        f"ServerAliveInterval={KEEPALIVE_INTERVAL}",
        "-o",
        f"ServerAliveCountMax={KEEPALIVE_COUNT}",
        "-T",  # no pseudo-terminal, whatever RequestTTY says
        "-x",  # no X11 forwarding
    ]
    return argv


def remote_target(host_name: str) -> str:
    """How rsync names the host in ``HOST:DEST`` (IPv6 addresses in brackets)."""
    return f"[{host_name}]" if ":" in host_name else host_name


# --------------------------------------------------------------------------- ssh -G


@dataclass(frozen=True)
class Resolved:
    """What ``ssh -G`` says about one host: where it goes, and whether the
    config sets a ConnectTimeout."""

    target: str  # the name to give ssh: the alias, or the hostfile's address
    hostname: str  # the HostName ssh will connect to
    config_timeout: bool
    algorithms: Mapping[str, str] = field(default_factory=dict)  # kexalgorithms, ciphers


def parse_ssh_g(text: str) -> dict[str, str]:
    """``ssh -G`` output as ``{keyword: value}`` (lower-case keywords, first value wins)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key and key.lower() not in out:
            out[key.lower()] = value.strip()
    return out


async def _ssh_g(argv: Sequence[str], name: str) -> dict[str, str]:
    try:
        code, out, err = await communicate(*argv, "-G", name)
    except OSError as exc:
        why = exc.strerror or exc
        raise ConfigError(f"cannot run {argv[0]!r}: {why} (install OpenSSH)") from exc
    if code != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        raise ConfigError(
            f"ssh cannot use its config for {name}: {lines[-1] if lines else 'ssh -G failed'}",
            option="--ssh-config",
        )
    return parse_ssh_g(out.decode(errors="replace"))


async def resolve_host(options: SshOptions, host: Host, *, ssh: str = "ssh") -> Resolved:
    """Ask ``ssh -G`` how ``host`` resolves (no connection is made).

    As in the SSH transport, the target is the host's name (an alias or DNS
    name) unless the config gives it no HostName and the hostfile gives an
    explicit ``address``: then that address is used.
    """
    base = ssh_argv(options, host, ssh=ssh)
    facts = await _ssh_g(base, host.name)
    target = host.name
    if facts.get("hostname", host.name) == host.name and host.address not in ("", host.name):
        target = host.address
        facts = await _ssh_g(base, target)
    timeout = facts.get("connecttimeout", "none").lower()
    return Resolved(
        target=target,
        hostname=facts.get("hostname", target),
        config_timeout=timeout not in ("", "none", "0"),
        algorithms={k: facts[k] for k in _TUNED if k in facts},
    )


#: Put first when OpenSSH offers them (the order of corral's asyncssh transport).
FAST_KEX = ("mlkem768x25519-sha256", "curve25519-sha256", "curve25519-sha256@libssh.org")
#: Put first when this CPU has AES instructions.
FAST_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
_TUNED = {"kexalgorithms": "KexAlgorithms", "ciphers": "Ciphers"}


async def builtin_algorithms(*, ssh: str = "ssh") -> dict[str, str]:
    """OpenSSH's built-in KexAlgorithms and Ciphers lists (no config file read)."""
    facts = await _ssh_g([ssh, "-F", "/dev/null"], "corral-builtin-probe")
    return {k: facts[k] for k in _TUNED if k in facts}


def reorder(builtin: str, first: Sequence[str]) -> str | None:
    """``builtin`` (comma-separated) with ``first`` moved ahead; None when unchanged."""
    algs = [a for a in builtin.split(",") if a]
    ahead = [a for a in first if a in algs]
    order = ahead + [a for a in algs if a not in ahead]
    return ",".join(order) if order != algs else None


def has_hw_aes() -> bool:
    """Whether this CPU has AES instructions (``aes`` in /proc/cpuinfo; True elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return True
    return re.search(r"^(flags|Features)\s*:.*\baes\b", text, re.M) is not None


def tuning_options(
    resolved: Resolved, builtin: Mapping[str, str], *, hw_aes: bool = True
) -> list[str]:
    """``-o`` options reordering the algorithm lists the ssh config left at the built-in."""
    out: list[str] = []
    for keyword, first in (("kexalgorithms", FAST_KEX), ("ciphers", FAST_CIPHERS)):
        if keyword == "ciphers" and not hw_aes:
            continue
        value = builtin.get(keyword)
        if not value or resolved.algorithms.get(keyword) != value:
            continue  # the user's config chose: respected
        order = reorder(value, first)
        if order is not None:
            out += ["-o", f"{_TUNED[keyword]}={order}"]
    return out


# --------------------------------------------------------------------------- askpass


def write_askpass(directory: Path, variable: str) -> Path:
    """Write the askpass helper (prints ``$variable``; holds no secret) into ``directory``."""
    if not is_env_name(variable):
        raise ConfigError(
            f"invalid environment variable name {variable!r}", option="--ssh-password-env"
        )
    path = directory / "corral-askpass"
    path.write_text(f"#!/bin/sh\nprintf '%s\\n' \"${variable}\"\n")
    path.chmod(stat.S_IRWXU)
    return path


def askpass_env(helper: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for ssh to take its password from ``helper`` (never a terminal)."""
    env = dict(os.environ if base is None else base)
    env["SSH_ASKPASS"] = str(helper)
    env["SSH_ASKPASS_REQUIRE"] = "force"  # OpenSSH >= 8.4
    env.setdefault("DISPLAY", ":0")  # older OpenSSH only asks askpass with a DISPLAY
    return env
