"""Options and helpers shared by every CLI verb (the CLUSTER option group)."""

from __future__ import annotations

from typing import Annotated

import typer

from corral.errors import ConfigError

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
