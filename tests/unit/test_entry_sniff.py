"""What the entry point reads from a command line before the CLI loads
(:func:`corral.cli.entry.sniff`): only a ``corral run`` on ``local:N`` with the
pre-flight, no calibration and the script after ``--``; anything else starts nothing.
The launcher read there decides whether the agents start torchrun warm."""

from __future__ import annotations

import pytest

from corral.cli.entry import Sniffed, sniff

SCRIPT = ("--", "train.py", "--hosts", "h1,h2", "--python", "ignored", "--job-id", "no")
TR = "torchrun"  # the default launcher


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (("run", "--hosts", "local:2", *SCRIPT), {}, Sniffed(2, None, None, TR)),
        (("run", "--hosts=local:3", *SCRIPT), {}, Sniffed(3, None, None, TR)),
        (("-v", "run", "--hosts", "local:1", *SCRIPT), {}, Sniffed(1, None, None, TR)),
        (
            ("run", "--python", "/opt/py", "--hosts", "local:2", "--job-id=j1", *SCRIPT),
            {},
            Sniffed(2, "/opt/py", "j1", TR),
        ),
        (("run", *SCRIPT), {"CORRAL_HOSTS": "local:4"}, Sniffed(4, None, None, TR)),
        (
            ("run", "--hosts", "local:2", *SCRIPT),
            {"CORRAL_HOSTS": "h1", "CORRAL_PYTHON": "/p"},
            Sniffed(2, "/p", None, TR),
        ),
        # the last of a repeated option wins, as in click
        (("run", "--hosts", "h1", "--hosts", "local:2", *SCRIPT), {}, Sniffed(2, None, None, TR)),
        # the launcher: --launcher, else CORRAL_LAUNCHER, else accelerate with --harness
        (
            ("run", "--hosts", "local:2", "--launcher", "python", *SCRIPT, "--launcher", "x"),
            {"CORRAL_LAUNCHER": "mlx"},
            Sniffed(2, None, None, "python"),
        ),
        (
            ("run", "--hosts", "local:2", "--launcher=mlx", *SCRIPT),
            {},
            Sniffed(2, None, None, "mlx"),
        ),
        (
            ("run", "--hosts", "local:2", *SCRIPT),
            {"CORRAL_LAUNCHER": "python"},
            Sniffed(2, None, None, "python"),
        ),
        (
            ("run", "--hosts", "local:2", "--harness", *SCRIPT),
            {},
            Sniffed(2, None, None, "accelerate"),
        ),
        (
            ("run", "--hosts", "local:2", "--harness", "--no-harness", *SCRIPT),
            {},
            Sniffed(2, None, None, TR),
        ),
        (
            ("run", "--hosts", "local:2", "--harness", "--launcher", TR, *SCRIPT),
            {},
            Sniffed(2, None, None, TR),
        ),
    ],
)
def test_a_local_run_is_read(argv: tuple[str, ...], env: dict[str, str], expected: Sniffed) -> None:
    assert sniff(argv, env) == expected


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (("run", "--hosts", "local:2", "train.py"), {}),  # no --: the script's words are unsure
        (("run", "--hosts", "h1,h2", *SCRIPT), {}),
        (("run", "--hosts", "hosts.txt", *SCRIPT), {}),
        (("run", "--hosts", "local:x", *SCRIPT), {}),
        (("run", "--hosts", "local:-1", *SCRIPT), {}),
        (("run", *SCRIPT), {}),  # no hosts at all
        (("plan", "--hosts", "local:2", *SCRIPT), {}),
        (("check", "--hosts", "local:2"), {}),
        (("run", "--hosts", "local:2", "--no-preflight", *SCRIPT), {}),
        (("run", "--hosts", "local:2", *SCRIPT), {"CORRAL_NO_PREFLIGHT": "1"}),
        (("run", "--hosts", "local:2", "--calibration", "auto", *SCRIPT), {}),
        (("run", "--hosts", "local:2", "--calibration=cal.json", *SCRIPT), {}),
        (("run", "--hosts", "local:2", "--help", *SCRIPT), {}),
        (("run", "--hosts", "local:2", "-h", *SCRIPT), {}),
        (("--version",), {}),
        ((), {}),
    ],
)
def test_anything_else_starts_nothing(argv: tuple[str, ...], env: dict[str, str]) -> None:
    assert sniff(argv, env) is None


def test_the_words_read_early_are_the_schemas_and_the_clis() -> None:
    """The entry point reads flags before the schema loads (it must not import it):
    the flags and variables it reads are those the schema and `corral run` declare."""
    from corral.cli.common import HostsOpt
    from corral.cli.options import CalibrationOpt
    from corral.job.schema import options_of

    declared = {f.name: (o.flag, o.envvar) for f, o in options_of()}
    assert declared["python"] == ("--python", "CORRAL_PYTHON")
    assert declared["job_id"][0] == "--job-id"
    assert declared["preflight"] == ("--no-preflight", "CORRAL_NO_PREFLIGHT")
    assert declared["launcher"] == ("--launcher", "CORRAL_LAUNCHER")
    assert declared["harness"][0] == "--harness"
    hosts = HostsOpt.__metadata__[0]
    assert hosts.default == "--hosts" and hosts.envvar == "CORRAL_HOSTS"
    assert CalibrationOpt.__metadata__[0].default == "--calibration"


def test_the_default_launcher_read_early_is_the_jobs() -> None:
    from corral.cli.entry import _DEFAULT_LAUNCHER
    from corral.job.build import job_spec
    from corral.job.schema import JobOptions

    assert job_spec(JobOptions(command=("train.py",))).launcher == _DEFAULT_LAUNCHER


def test_the_launcher_the_agents_start_warm_is_the_head_starts() -> None:
    from corral.agent.warm import WARM_MODULES
    from corral.cli.entry import _WARM_LAUNCHER
    from corral.job.headstart import warm_module

    assert warm_module(_WARM_LAUNCHER) in WARM_MODULES


def test_the_entry_point_starts_the_agents_with_the_standard_library_alone() -> None:
    """Until the agents are started the entry point loads no ``subprocess``, ``asyncio``,
    ``dataclasses``, ``json`` or ``pathlib`` (40-80 ms, more under load, that each
    agent's start and its warm torchrun would wait for): what is loaded when
    ``posix_spawnp`` runs."""
    import json
    import subprocess
    import sys

    probe = (
        "import os, sys\n"
        "heavy = ('subprocess', 'asyncio', 'dataclasses', 'json', 'pathlib', 'pydantic')\n"
        "seen = []\n"
        "def spawn(path, argv, env, **kw):\n"
        "    seen.append(sorted(m for m in heavy if m in sys.modules))\n"
        "    raise OSError('not started')\n"
        "os.posix_spawnp = spawn\n"
        "from corral.cli.entry import Sniffed, _start\n"
        "_start(Sniffed(1, None, 'stdlib-only', 'torchrun'))\n"
        "print(seen)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(done.stdout.strip().replace("'", '"')) == [[]], done.stderr


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (("run", "--hosts", "h1,h2", "--", "train.py"), {}, True),
        (("-v", "exec", "--hosts=hosts.txt", "--", "ls"), {}, True),
        (("ping",), {"CORRAL_HOSTS": "hosts.txt"}, True),
        (("check", "--hosts", "local:2"), {}, False),
        (("run", "--hosts", "h1", "--", "x.py", "--hosts", "local:2"), {}, True),  # the script's
        (("run", "--", "x.py"), {}, False),
        (("job", "--hosts", "h1"), {}, False),  # not an SSH verb
        (("serve",), {"CORRAL_HOSTS": "h1"}, False),
    ],
)
def test_which_commands_reach_ssh_hosts(
    argv: tuple[str, ...], env: dict[str, str], expected: bool
) -> None:
    from corral.cli.entry import reaches_ssh

    assert reaches_ssh(argv, env) is expected


def test_the_ssh_transport_loads_in_the_background_while_the_cli_does() -> None:
    """For a verb on SSH hosts the entry point imports the SSH transport (asyncssh) on a
    thread of its own: the thread that imported it is that one."""
    import subprocess
    import sys

    probe = (
        "import sys, threading\n"
        "seen = []\n"
        "def hook(event, args):\n"
        "    if event == 'import' and args[0] == 'asyncssh' and not seen:\n"
        "        seen.append(threading.current_thread().name)\n"
        "sys.addaudithook(hook)\n"
        "sys.argv = ['corral', 'ping', '--hosts', 'nohost.invalid', '--help']\n"
        "from corral.cli.entry import main\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "for t in threading.enumerate():\n"
        "    if t.name == 'corral-ssh-preload':\n"
        "        t.join(60)\n"
        "print('IMPORTED-BY', seen)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert "IMPORTED-BY ['corral-ssh-preload']" in done.stdout, done.stdout + done.stderr
