"""Options and helpers shared by every CLI verb (the CLUSTER option group).

The SSH flags are defined once: a verb takes ``ssh: SshOptions`` and is decorated
with :func:`ssh_flags`, which shows the flags in its help and builds the value
(:func:`ssh_options`) from them.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any, ParamSpec, TypeVar

import typer

from corral.cluster import load_cluster
from corral.cluster.model import Cluster
from corral.errors import ConfigError
from corral.transport.options import SshOptions

HostsOpt = Annotated[
    str | None,
    typer.Option(
        "--hosts",
        metavar="FILE|local:N|h1,h2",
        envvar="CORRAL_HOSTS",
        help="Hostfile path, 'local:N' (N simulated nodes here) or 'h1,h2,...'.",
        rich_help_panel="Cluster",
    ),
]
SshUserOpt = Annotated[
    str | None,
    typer.Option(
        "--ssh-user",
        metavar="USER",
        envvar="CORRAL_SSH_USER",
        help="SSH user for every host.",
        rich_help_panel="Cluster",
    ),
]
SshKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--ssh-key",
        metavar="FILE",
        envvar="CORRAL_SSH_KEY",
        help="SSH private key file.",
        rich_help_panel="Cluster",
    ),
]
SshPortOpt = Annotated[
    int | None,
    typer.Option(
        "--ssh-port",
        metavar="PORT",
        envvar="CORRAL_SSH_PORT",
        help="SSH port for every host.",
        rich_help_panel="Cluster",
    ),
]
SshPasswordEnvOpt = Annotated[
    str | None,
    typer.Option(
        "--ssh-password-env",
        metavar="VAR",
        envvar="CORRAL_SSH_PASSWORD_ENV",
        help="Name of an environment variable holding the SSH password (never the password).",
        rich_help_panel="Cluster",
    ),
]
SshConfigOpt = Annotated[
    str | None,
    typer.Option(
        "--ssh-config",
        metavar="FILE",
        envvar="CORRAL_SSH_CONFIG",
        help="OpenSSH client config file.",
        rich_help_panel="Cluster",
    ),
]
AcceptNewHostKeysOpt = Annotated[
    bool,
    typer.Option(
        "--accept-new-host-keys",
        envvar="CORRAL_ACCEPT_NEW_HOST_KEYS",
        help="Trust and record keys of hosts not yet in known_hosts (OpenSSH "
        "accept-new); a changed key is always refused.",
        rich_help_panel="Cluster",
    ),
]
InsecureNoHostKeyCheckOpt = Annotated[
    bool,
    typer.Option(
        "--insecure-no-host-key-check",
        envvar="CORRAL_INSECURE_NO_HOST_KEY_CHECK",
        help="Do not verify SSH host keys at all (insecure: open to man-in-the-middle "
        "attacks). Also the only way to run with 'UserKnownHostsFile none' or "
        "'StrictHostKeyChecking no' in the ssh config, which corral otherwise refuses.",
        rich_help_panel="Cluster",
    ),
]


def require_hosts(hosts: str | None) -> str:
    """The ``--hosts`` value, or a ConfigError that says how to give one."""
    if not hosts:
        raise ConfigError(
            "no cluster given: pass --hosts FILE, --hosts local:N or --hosts h1,h2 "
            "(or set CORRAL_HOSTS)",
            option="--hosts",
        )
    return hosts


_SSH_FLAGS: dict[str, tuple[str, Any, object]] = {
    # SshOptions field: (the verb's parameter, its option, its default)
    "user": ("ssh_user", SshUserOpt, None),
    "key": ("ssh_key", SshKeyOpt, None),
    "port": ("ssh_port", SshPortOpt, None),
    "password_env": ("ssh_password_env", SshPasswordEnvOpt, None),
    "config": ("ssh_config", SshConfigOpt, None),
    "accept_new_host_keys": ("accept_new_host_keys", AcceptNewHostKeysOpt, False),
    "insecure_no_host_key_check": (
        "insecure_no_host_key_check",
        InsecureNoHostKeyCheckOpt,
        False,
    ),
}

P = ParamSpec("P")
R = TypeVar("R")


def ssh_options(flags: dict[str, Any]) -> SshOptions:
    """The SshOptions of the SSH flags' values, keyed by parameter (``ssh_user``...);
    a flag not given keeps SshOptions' default."""
    return SshOptions(
        **{field: flags[param] for field, (param, _, _) in _SSH_FLAGS.items() if param in flags}
    )


def ssh_flags(*fields: str) -> Callable[[Callable[P, R]], Callable[..., R]]:
    """Give a verb the SSH flags of the CLUSTER group in place of its ``ssh: SshOptions``
    parameter: all of them, or those of the SshOptions ``fields`` named (in that order)."""
    chosen = [_SSH_FLAGS[f] for f in fields or _SSH_FLAGS]

    def decorate(func: Callable[P, R]) -> Callable[..., R]:
        hints = typing.get_type_hints(func, include_extras=True)
        signature = inspect.signature(func)
        params: list[inspect.Parameter] = []
        for param in signature.parameters.values():
            if param.name != "ssh":
                params.append(param.replace(annotation=hints.get(param.name, param.annotation)))
                continue
            params += [
                inspect.Parameter(name, param.kind, default=default, annotation=option)
                for name, option, default in chosen
            ]
        names = {name for name, _, _ in chosen}

        @functools.wraps(func)
        def verb(*args: Any, **kwargs: Any) -> R:
            flags = {k: kwargs.pop(k) for k in names & kwargs.keys()}
            return func(*args, ssh=ssh_options(flags), **kwargs)  # type: ignore[arg-type]

        verb.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        verb.__annotations__ = {p.name: p.annotation for p in params}
        return verb

    return decorate


def load_hosts(hosts: str | None, ssh: SshOptions) -> Cluster:
    """The cluster of ``--hosts`` (required), with the SSH user and port as defaults."""
    return load_cluster(require_hosts(hosts), ssh_user=ssh.user, ssh_port=ssh.port)
