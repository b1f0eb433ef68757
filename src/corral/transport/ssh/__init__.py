"""The SSH transport (asyncssh): connections, host keys, remote processes.

Modules: :mod:`.transport` (SshTransport: connections, retries, concurrency,
keepalives), :mod:`.process` (SshProcess), :mod:`.command` (remote command
lines), :mod:`.config` (the user's ssh config, host key settings),
:mod:`.known_hosts` (the known_hosts policy), :mod:`.auth` (the key file),
:mod:`.errors` (asyncssh/OS errors -> corral's error tree), :mod:`.settings`.
"""

from corral.transport.ssh.command import PID_PREAMBLE, build_command, build_shell_command
from corral.transport.ssh.config import INSECURE_OPTION
from corral.transport.ssh.errors import is_transient, translate_error
from corral.transport.ssh.known_hosts import HostKeyDecision, HostKeyVerdict, KnownHostsPolicy
from corral.transport.ssh.process import EXIT_LOST, SshProcess
from corral.transport.ssh.settings import SshSettings
from corral.transport.ssh.transport import CompletedCommand, SshTransport

__all__ = [
    "EXIT_LOST",
    "INSECURE_OPTION",
    "PID_PREAMBLE",
    "CompletedCommand",
    "HostKeyDecision",
    "HostKeyVerdict",
    "KnownHostsPolicy",
    "SshProcess",
    "SshSettings",
    "SshTransport",
    "build_command",
    "build_shell_command",
    "is_transient",
    "translate_error",
]
