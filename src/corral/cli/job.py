"""``corral job``: the command-line client of ``corral serve`` (like ``ray job``).

``submit`` plans a job on the server's machines and dispatches it; ``list``,
``status`` and ``logs`` read it back; ``stop`` tears it down. Every verb talks to
``--server`` (``CORRAL_SERVER``) with the server's token, read from ``CORRAL_TOKEN``
or a token file: never from the command line, and never printed.

``logs -f`` (and ``submit -f``) follow the job's live events (Server-Sent Events),
resume after a dropped connection from the last event seen (``Last-Event-ID``),
and exit with the job's exit code as ``corral run`` would: 0 success, the failing
rank's own code, 124 timeout, 130 cancelled, 255 lost, 3 could not start.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, get_args
from urllib.parse import urlsplit

import httpx
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from corral.cli.run import (
    CheckpointOpt,
    CommandTemplateOpt,
    EnvOpt,
    HangTimeoutOpt,
    MaxRestartsOpt,
    NoPreflightOpt,
    PythonOpt,
    SecretEnvOpt,
    TimeoutOpt,
    WorkdirOpt,
)
from corral.console import make_console
from corral.errors import ConfigError, CorralError
from corral.job.events import (
    AttemptEnded,
    AttemptStarted,
    JobEvent,
    LogLines,
    Message,
    NodeChanged,
    Progress,
    RankExited,
    StateChanged,
)
from corral.job.output import TerminalOutput, format_progress, say
from corral.job.result import Failure
from corral.job.summary import root_cause_text
from corral.plan.display import weights_line
from corral.service.models import ServiceLauncher

DEFAULT_SERVER = "http://127.0.0.1:8765"
TERMINAL_STATES = ("succeeded", "failed", "timed_out", "cancelled", "lost")
#: Exit codes of ended jobs that carry none (as ``corral run`` exits).
STATE_EXIT_CODES = {"succeeded": 0, "failed": 1, "timed_out": 124, "cancelled": 130, "lost": 255}
EXIT_LOST = 255
EXIT_COULD_NOT_START = 3
EXIT_INTERRUPTED = 130
REQUEST_TIMEOUT = 30.0
STREAM_READ_TIMEOUT = 60.0  # the server pings every 15 s
RECONNECT_FOR = 60.0  # seconds a follow keeps trying to reconnect before giving up
PAGE_LINES = 2000
_EVENT_TYPES: dict[str, type[JobEvent]] = {
    "state": StateChanged,
    "node": NodeChanged,
    "rank_exit": RankExited,
    "progress": Progress,
    "message": Message,
    "attempt_started": AttemptStarted,
    "attempt_ended": AttemptEnded,
}

_C = "Server"
_L = "Launch"
SUBMIT_LAUNCHERS: tuple[str, ...] = get_args(ServiceLauncher)
"""The launchers a job of ``corral serve`` can use (its ``JobRequest.launcher``)."""
SubmitLauncherOpt = Annotated[
    str,
    typer.Option(
        "--launcher",
        metavar="|".join(SUBMIT_LAUNCHERS),
        envvar="CORRAL_LAUNCHER",
        help=f"How ranks are started: {'|'.join(SUBMIT_LAUNCHERS)} (command: "
        "--command-template, no SCRIPT). See docs/launchers.md.",
        rich_help_panel=_L,
    ),
]


# -- errors ------------------------------------------------------------------------------


class ServerUnreachable(CorralError):
    """``corral serve`` does not answer at the URL (refused, timed out, connection cut)."""


class TokenRefused(CorralError):
    """The server answered 401: the token is missing or wrong."""

    def __init__(self) -> None:
        super().__init__("the server refused the token (set CORRAL_TOKEN or --token-file)")


class ServerError(CorralError):
    """An error answer of the server: its message, HTTP status, type and details."""

    def __init__(self, message: str, *, status: int, kind: str, info: Any = None) -> None:
        self.status = status
        self.kind = kind
        self.info = info
        super().__init__(message)

    def details(self) -> list[str]:
        lines = [f"HTTP {self.status} ({self.kind})"]
        if isinstance(self.info, dict):
            lines += [f"{k}: {json.dumps(v, default=str)}" for k, v in self.info.items()]
        return lines


# -- the HTTP client ---------------------------------------------------------------------


@dataclass(frozen=True)
class SseEvent:
    """One Server-Sent Event: its id (a byte offset here), name and data."""

    id: str | None
    event: str
    data: str


def parse_sse(lines: Iterable[str]) -> Iterator[SseEvent]:
    """The events of a ``text/event-stream`` given line by line (comments skipped)."""
    event_id: str | None = None
    name = "message"
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield SseEvent(event_id, name, "\n".join(data))
            name, data = "message", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "data":
            data.append(value)
        elif field == "event":
            name = value
        elif field == "id" and "\0" not in value:
            event_id = value


def read_token(token_file: str | None) -> str:
    """The token: from ``token_file`` when given, else ``CORRAL_TOKEN``, else the
    server's default token file."""
    token = None if token_file else os.environ.get("CORRAL_TOKEN", "").strip()
    if token:
        return token
    from corral.api.auth import default_token_file

    path = Path(token_file).expanduser() if token_file else default_token_file()
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        raise ConfigError(
            f"no token: {path} does not exist; set CORRAL_TOKEN or --token-file (the "
            "server shows its token with `corral serve --print-token`)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}", option="--token-file") from exc
    if not token:
        raise ConfigError(f"{path} is empty", option="--token-file")
    return token


def _is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Client:
    """A synchronous client of ``corral serve`` with its errors made one-liners."""

    def __init__(self, server: str, token: str) -> None:
        server = server.rstrip("/")
        if urlsplit(server).scheme not in ("http", "https") or not urlsplit(server).hostname:
            raise ConfigError(f"{server!r} is not an http(s) URL", option="--server")
        self.server = server
        try:
            self.http = httpx.Client(
                base_url=server,
                headers={"Authorization": f"Bearer {token}"},
                timeout=REQUEST_TIMEOUT,
            )
        except httpx.InvalidURL as exc:
            raise ConfigError(f"{server!r}: {exc}", option="--server") from exc

    def close(self) -> None:
        self.http.close()

    def unreachable(self, exc: Exception) -> ServerUnreachable:
        """The one-line error for a transport failure."""
        reason = re.sub(r"^\[Errno -?\d+\] ", "", str(exc)) or type(exc).__name__
        if isinstance(exc, httpx.TimeoutException):
            reason = f"no answer within {REQUEST_TIMEOUT:g} s"
        return ServerUnreachable(f"cannot reach corral serve at {self.server}: {reason}")

    def check(self, response: httpx.Response) -> None:
        """Raise the error a non-2xx answer stands for (the body must be read)."""
        if response.status_code < 400:
            return
        if response.status_code == 401:
            raise TokenRefused()
        try:
            error = response.json()["error"]
            message, kind, info = str(error["message"]), str(error["type"]), error.get("details")
        except (ValueError, KeyError, TypeError):
            text = " ".join(response.text.split())[:200]
            message = f"HTTP {response.status_code} from {self.server}: {text or 'no body'}"
            kind, info = "http_error", None
        raise ServerError(message, status=response.status_code, kind=kind, info=info)

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """One request; its JSON answer."""
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise self.unreachable(exc) from exc
        self.check(response)
        return response.json()

    def events(self, job_id: str, last_id: str | None = None) -> Iterator[SseEvent]:
        """The job's events from after ``last_id``, live, until the server ends the
        stream; a dropped connection is resumed from the last event seen (for up to
        :data:`RECONNECT_FOR` seconds of failures)."""
        failing_since: float | None = None
        delay = 0.25
        while True:
            headers = {"Last-Event-ID": last_id} if last_id else {}
            timeout = httpx.Timeout(REQUEST_TIMEOUT, read=STREAM_READ_TIMEOUT)
            try:
                with self.http.stream(
                    "GET", f"/api/jobs/{job_id}/events", headers=headers, timeout=timeout
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        self.check(response)
                    failing_since, delay = None, 0.25
                    for event in parse_sse(response.iter_lines()):
                        last_id = event.id or last_id
                        yield event
                return
            except httpx.HTTPError as exc:
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > RECONNECT_FOR:
                    raise self.unreachable(exc) from exc
                time.sleep(delay)
                delay = min(delay * 2, 5.0)


def _client(server: str, token_file: str | None) -> Client:
    return Client(server, read_token(token_file))


# -- options shared by every verb -------------------------------------------------------

SubmitCalibrationOpt = Annotated[
    str | None,
    typer.Option(
        "--calibration",
        metavar="FILE",
        help="A calibration file on the server (what `corral calibrate` saved): each rank's "
        "share of the work in proportion to its measured throughput; hosts are matched to "
        "the machines by name.",
        rich_help_panel=_L,
    ),
]
SubmitRebalanceOpt = Annotated[
    bool,
    typer.Option(
        "--rebalance",
        help="With --calibration: at each restart, re-weigh the ranks from their live "
        "throughput (sdk.report(step, examples=N)).",
        rich_help_panel=_L,
    ),
]
ServerOpt = Annotated[
    str,
    typer.Option(
        "--server",
        metavar="URL",
        envvar="CORRAL_SERVER",
        help="The corral serve to talk to.",
        rich_help_panel=_C,
    ),
]
TokenFileOpt = Annotated[
    str | None,
    typer.Option(
        "--token-file",
        metavar="FILE",
        envvar="CORRAL_TOKEN_FILE",
        help="File holding the server's token (default: $CORRAL_TOKEN, else "
        "~/.local/share/corral/token).",
        rich_help_panel=_C,
    ),
]
JobArg = Annotated[str, typer.Argument(metavar="JOB", help="The job id.", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


# -- rendering ---------------------------------------------------------------------------


def exit_code_of(status: dict[str, Any]) -> int:
    """What ``corral run`` would have exited with for this job; 0 while it runs."""
    state = str(status.get("status"))
    if state not in TERMINAL_STATES:
        return 0
    if state == "lost":
        return EXIT_LOST
    code = status.get("exit_code")
    return int(code) if code is not None else STATE_EXIT_CODES[state]


def duration_text(seconds: float | None) -> str:
    """``4.2s``, ``3m07s``, ``2h05m``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _when(stamp: float | None) -> str:
    return "-" if stamp is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


_STATE_STYLE = {
    "succeeded": "green",
    "exited": "green",
    "failed": "bold red",
    "lost": "bold red",
    "timed_out": "red",
    "cancelled": "yellow",
    "running": "cyan",
}


def _state(state: str) -> Text:
    return Text(state, style=_STATE_STYLE.get(state, ""))


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return "-"
    if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(r) for r in ranks)


def _node_progress(progress: dict[str, Any]) -> str:
    if progress.get("step") is None:
        return ""
    text = format_progress(progress)
    if progress.get("percent") is not None:
        text += f" ({progress['percent']:g}%"
        if progress.get("eta_s") is not None:
            text += f", eta {duration_text(progress['eta_s'])}"
        text += ")"
    return text


def root_cause_block(cause: dict[str, Any]) -> Text:
    """The root-cause block of a job's status (as ``corral run`` prints it), with the
    failed rank's log tail when its stderr tail is empty."""
    if cause.get("host") is None:
        text = Text("root cause: ", style="bold red")
        text.append(str(cause.get("message") or "unknown"))
        for line in cause.get("details") or []:
            text.append(f"\n  {line}")
        return text
    failure = Failure(
        host=str(cause["host"]),
        rank=cause.get("rank"),
        code=cause.get("code"),
        time=float(cause.get("time") or 0),
        message=str(cause.get("message") or ""),
        stderr_tail=list(cause.get("stderr_tail") or []),
        traceback=cause.get("traceback"),
        exit_code=int(cause.get("exit_code") or 1),
    )
    text = root_cause_text(failure, [])
    tail = cause.get("log_tail") or []
    if tail and not failure.stderr_tail and not failure.traceback:
        text.append(f"  last {len(tail)} lines of its log:\n", style="bold")
        for line in tail:
            text.append(f"    {line}\n")
    text.rstrip()
    return text


def print_status(status: dict[str, Any], console: Console) -> None:
    """A job's status: state and reason, master, nodes, attempts, root cause."""
    state = str(status["status"])
    title = Text(f"job {status['job_id']}")
    if status.get("name"):
        title.append(f" ({status['name']})")
    title.append(": ")
    title.append_text(_state(state))
    if status.get("reason"):
        title.append(f": {status['reason']}")
    console.print(title, soft_wrap=True)
    ran = None
    if status.get("started"):
        ran = (status.get("ended") or time.time()) - status["started"]
    facts = [
        f"master {status.get('master') or '-'}, world size {status.get('world_size')}, "
        f"machines {', '.join(status.get('machines') or []) or '-'}",
        f"attempt {status.get('attempt', 0)} ({status.get('restarts', 0)} restarts), "
        f"started {_when(status.get('started'))}, ran {duration_text(ran)}",
    ]
    if status.get("workload_weights"):  # the current attempt's (--rebalance changes them)
        facts.append(_weights_line(status))
    for fact in facts:
        console.print(f"  {fact}", markup=False, soft_wrap=True)
    if status.get("nodes"):
        table = Table(title="nodes", title_justify="left")
        for column in ("node", "host", "ranks", "state", "progress", "detail"):
            table.add_column(column, overflow="fold")
        for node in status["nodes"]:
            table.add_row(
                str(node["node_rank"]),
                node["host"],
                _ranks(node.get("ranks") or []),
                _state(str(node["status"])),
                _node_progress(node.get("progress") or {}),
                node.get("detail") or "",
            )
        console.print(table)
    if status.get("attempts"):
        console.print(_attempts_table(status["attempts"]))
    cause = status.get("root_cause")
    if cause and state != "succeeded":
        console.print(root_cause_block(cause), soft_wrap=True)
    if state in TERMINAL_STATES:
        console.print(f"exit code {exit_code_of(status)}", style="dim", markup=False)


def _attempts_table(attempts: list[dict[str, Any]]) -> Table:
    table = Table(title="attempts", title_justify="left")
    for column in ("attempt", "hosts", "ranks", "result", "cause", "duration", "resumed from"):
        table.add_column(column, overflow="fold")
    for attempt in attempts:
        record = attempt.get("record") or {}
        result = str(record.get("state") or ("running" if attempt.get("ended") is None else "-"))
        ran = None
        if attempt.get("started") and attempt.get("ended"):
            ran = attempt["ended"] - attempt["started"]
        table.add_row(
            str(attempt["number"]),
            ",".join(attempt.get("hosts") or []),
            str(attempt.get("world_size") or "-"),
            _state(result),
            "" if result in ("succeeded", "running") else str(attempt.get("cause") or ""),
            duration_text(ran),
            attempt.get("checkpoint") or "",
        )
    return table


# -- following a job --------------------------------------------------------------------


def _show_checked(data: dict[str, Any], console: Console) -> None:
    """The pre-flight's problems (every failing and warning check) and its verdict."""
    report = data.get("report") or {}
    checks = report.get("checks") if isinstance(report, dict) else None
    for check in checks or []:
        status = check.get("status")
        if status not in ("fail", "warn"):
            continue
        line = f"pre-flight {check.get('name')}: {check.get('error') or check.get('warning')}"
        if check.get("fix_command"):
            line += f" (fix: {check['fix_command']})"
        say(console, line, "bold red" if status == "fail" else "yellow")
    if data.get("blocking"):
        say(console, "the pre-flight checklist refused the launch", "bold red")


def _wanted(host: str, rank: int, only_host: str | None, only_rank: int | None) -> bool:
    return (only_host is None or host == only_host) and (only_rank is None or rank == only_rank)


def _wait_until_ended(client: Client, job_id: str, within: float = 10.0) -> dict[str, Any]:
    """The job's status once the server has recorded its end (or after ``within`` s)."""
    deadline = time.monotonic() + within
    status: dict[str, Any] = client.call("GET", f"/api/jobs/{job_id}")
    while status["status"] not in TERMINAL_STATES and time.monotonic() < deadline:
        time.sleep(0.2)
        status = client.call("GET", f"/api/jobs/{job_id}")
    return status


def follow(client: Client, job_id: str, *, host: str | None = None, rank: int | None = None) -> int:
    """Print the job's output and corral's messages live until it ends; its exit code."""
    output = TerminalOutput()
    try:
        code = _follow_events(client, job_id, output, host, rank)
    except KeyboardInterrupt:
        output.close()
        say(
            make_console(),
            f"stopped following; job {job_id} goes on (corral job stop {job_id} stops it)",
            "yellow",
        )
        return EXIT_INTERRUPTED
    finally:
        output.close()  # idempotent
    try:
        status = _wait_until_ended(client, job_id)
    except ServerUnreachable:
        return code  # the last event said how it ended
    if status["status"] not in TERMINAL_STATES:
        return code
    _print_ending(status, make_console())
    return EXIT_LOST if status["status"] == "lost" else code


def _follow_events(
    client: Client, job_id: str, output: TerminalOutput, host: str | None, rank: int | None
) -> int:
    """Render the job's events until its last one; its exit code."""
    last_id: str | None = None
    while True:
        for event in client.events(job_id, last_id):
            last_id = event.id or last_id
            code = _render_event(event, output, job_id, host, rank)
            if code is not None:
                return code
        # the stream ended with no last event: the job ended unseen, or the server stopped
        time.sleep(0.5)
        try:
            status = client.call("GET", f"/api/jobs/{job_id}")
        except ServerUnreachable:
            continue  # reconnecting (for a while) is the stream's to do
        if status["status"] in TERMINAL_STATES:
            return exit_code_of(status)


def _render_event(
    event: SseEvent, output: TerminalOutput, job_id: str, host: str | None, rank: int | None
) -> int | None:
    """Show one event; the job's exit code when it is the last one."""
    try:
        data = json.loads(event.data)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    kind = str(data.get("kind") or event.event)
    if kind == "log":
        if _wanted(str(data.get("host")), int(data.get("rank", -1)), host, rank):
            text = str(data.get("text", ""))
            output.on_event(
                LogLines(job_id=job_id, host=data["host"], rank=data["rank"], data=text.encode())
            )
    elif kind in _EVENT_TYPES:
        try:
            parsed = _EVENT_TYPES[kind].model_validate({**data, "job_id": job_id})
        except ValueError:
            return None  # a newer server's event this client does not know
        output.on_event(parsed)
    elif kind == "checked":
        _show_checked(data, output.console)
    elif kind == "finished":
        return int(data.get("exit_code") or 0)
    elif kind == "error":
        return int(data.get("exit_code") or EXIT_COULD_NOT_START)
    elif kind == "lost":
        return EXIT_LOST
    return None


def _print_ending(status: dict[str, Any], console: Console) -> None:
    """The end of a followed job: the root cause when it failed, then one line."""
    state = str(status["status"])
    cause = status.get("root_cause")
    if cause and state != "succeeded":
        console.print(root_cause_block(cause), soft_wrap=True)
    ran = None
    if status.get("started") and status.get("ended"):
        ran = status["ended"] - status["started"]
    line = Text(f"job {status['job_id']}: ")
    line.append_text(_state(state))
    line.append(f", exit code {exit_code_of(status)}, {duration_text(ran)}")
    console.print(line, soft_wrap=True)


# -- verbs -------------------------------------------------------------------------------


def _request(
    command: list[str] | None,
    *,
    server: str,
    machines: int | None,
    machine: list[str] | None,
    gpus_per_machine: int | None,
    nproc_per_node: int | None,
    launcher: str,
    env: list[str] | None,
    secret_env: list[str] | None,
    workdir: str | None,
    python: str | None,
    max_restarts: int,
    command_template: str | None = None,
    checkpoint_dir: str | None,
    hang_timeout: float | None,
    timeout: float | None,
    no_preflight: bool,
    name: str | None,
    config: str | None,
    adjust_config: bool,
    calibration: str | None = None,
    rebalance: bool = False,
) -> dict[str, Any]:
    """The body of ``/distributed/plan`` for the submit options."""
    from corral.job.resolve import parse_env

    if launcher not in SUBMIT_LAUNCHERS:
        raise ConfigError(
            f"unknown launcher {launcher!r}; choose one of {', '.join(SUBMIT_LAUNCHERS)}",
            option="--launcher",
        )
    if command_template is not None and launcher != "command":
        raise ConfigError("applies to --launcher command only", option="--command-template")
    if launcher == "command":
        if command:
            raise ConfigError(
                f"--launcher command runs its --command-template on every machine and takes "
                f"no SCRIPT (got {command[0]!r} after --); put the script in the template",
                option="--launcher",
            )
        if not command_template:
            raise ConfigError(
                "--launcher command needs --command-template 'TEMPLATE'",
                option="--command-template",
            )
        script, args = None, []
    elif not command:
        raise ConfigError("no script given: corral job submit [OPTIONS] -- SCRIPT [ARGS...]")
    else:
        script, *args = command
        if not os.path.isabs(script) and os.path.isfile(script) and _is_loopback(server):
            script = os.path.abspath(script)  # the server runs here: the same file
    selected = list(machine or [])
    if selected and machines is not None and machines != len(selected):
        raise ConfigError(
            f"--machines {machines} but {len(selected)} --machine given", option="--machines"
        )
    if adjust_config and not config:
        raise ConfigError("needs --config FILE.json", option="--adjust-config")
    if rebalance and not calibration:
        raise ConfigError("needs --calibration FILE", option="--rebalance")
    if calibration and not os.path.isabs(calibration) and _is_loopback(server):
        calibration = os.path.abspath(calibration)  # the server runs here: the same file
    requirements: dict[str, Any] = {"num_machines": len(selected) or machines or 1}
    if gpus_per_machine is not None:
        requirements["gpus_per_machine"] = gpus_per_machine
    body: dict[str, Any] = {
        "args": args,
        "launcher": launcher,
        "resource_requirements": requirements,
        "machine_selection": "manual" if selected else "auto",
        "selected_machines": selected,
        "env": parse_env(env or []),
        "secret_env": list(secret_env or []),
        "preflight": not no_preflight,
        "adjust_config": adjust_config,
    }
    optional = {
        "script": script,
        "command_template": command_template,
        "name": name,
        "nproc_per_node": nproc_per_node,
        "workdir": workdir,
        "python": python,
        "max_restarts": max_restarts,
        "checkpoint_dir": checkpoint_dir,
        "hang_timeout": hang_timeout,
        "timeout": timeout,
        "calibration": calibration,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    if rebalance:
        body["rebalance"] = True
    if config:
        body["config"] = _read_config(config)
    return body


def _read_config(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", option="--config") from exc
    except ValueError as exc:
        raise ConfigError(f"{path} is not JSON: {exc}", option="--config") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds no JSON object", option="--config")
    return data


def _print_plan(plan: dict[str, Any], console: Console) -> None:
    """The execution plan as ``corral plan`` prints one: machines and why, then per
    node its env and copy-pasteable command lines (secret values redacted)."""
    table = Table(
        title=f"plan for job {plan['job_id']} ({plan['launcher']}, {len(plan['nodes'])} nodes, "
        f"{plan['world_size']} ranks)",
        title_justify="left",
    )
    for column in ("node", "host", "ranks", "cwd", "why"):
        table.add_column(column, overflow="fold")
    reasons = {m["name"]: m.get("reasons") or [] for m in plan.get("machines", [])}
    for node in plan["nodes"]:
        ranks = node.get("ranks")
        table.add_row(
            str(node["node_rank"]),
            node["host"],
            _ranks(ranks) if ranks else f"{node['nproc']} (assigned at rendezvous)",
            node["cwd"],
            "; ".join(reasons.get(node["host"], [])),
        )
    console.print(table)
    master = plan.get("master") or {}
    port = master.get("port") or "picked at launch"
    console.print(f"master: {master.get('host')} ({master.get('address')}:{port})", markup=False)
    if plan.get("workload_weights"):
        console.print(_weights_line(plan), markup=False)
    for node in plan["nodes"]:
        console.print(
            f"\nnode {node['node_rank']} ({node['host']}) env:", style="bold", markup=False
        )
        for key, value in (node.get("env") or {}).items():
            console.print(f"  {key}={value}", markup=False, soft_wrap=True)
        for run in node.get("commands") or []:
            console.print(f"node {node['node_rank']} {run['label']}:", style="bold", markup=False)
            console.print(run["line"], markup=False, soft_wrap=True)


def _weights_line(plan: dict[str, Any]) -> str:
    """The workload weights of a plan or a job status, as ``corral run --calibration``
    prints them."""
    return weights_line(
        (w["host"], int(w["local_rank"]), float(w["weight"])) for w in plan["workload_weights"]
    )


def _describe(plan: dict[str, Any]) -> str:
    master = plan.get("master") or {}
    names = ", ".join(m["name"] for m in plan.get("machines", []))
    return (
        f"job {plan['job_id']}: {names}; {plan['world_size']} ranks, launcher "
        f"{plan['launcher']}; master {master.get('host')} ({master.get('address')})"
    )


def submit(
    command: Annotated[
        list[str] | None,
        typer.Argument(
            help="The script (a path on the machines) and its arguments, after `--`.",
            show_default=False,
            metavar="-- SCRIPT [ARGS]...",
        ),
    ] = None,
    machines: Annotated[
        int | None,
        typer.Option(
            "--machines",
            metavar="N",
            min=1,
            help="How many machines (the server picks the best; default 1).",
            rich_help_panel=_L,
        ),
    ] = None,
    machine: Annotated[
        list[str] | None,
        typer.Option(
            "--machine",
            metavar="NAME",
            help="Run on this machine (name or id; repeatable): manual selection.",
            rich_help_panel=_L,
        ),
    ] = None,
    gpus_per_machine: Annotated[
        int | None,
        typer.Option(
            "--gpus-per-machine",
            metavar="N",
            min=0,
            help="GPUs (= ranks) each machine must have; 0 for CPU jobs.",
            rich_help_panel=_L,
        ),
    ] = None,
    nproc_per_node: Annotated[
        int | None,
        typer.Option(
            "--nproc-per-node",
            metavar="N",
            min=1,
            help="Ranks per machine (default: its GPUs, else its slots).",
            rich_help_panel=_L,
        ),
    ] = None,
    launcher: SubmitLauncherOpt = "torchrun",
    command_template: CommandTemplateOpt = None,
    env: EnvOpt = None,
    secret_env: SecretEnvOpt = None,
    workdir: WorkdirOpt = None,
    python: PythonOpt = None,
    timeout: TimeoutOpt = None,
    name: Annotated[
        str | None,
        typer.Option("--name", metavar="NAME", help="A name for the job.", rich_help_panel=_L),
    ] = None,
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            metavar="FILE",
            help="A JSON file: the job's config (ranks read it with corral.sdk.job_config()).",
            rich_help_panel=_L,
        ),
    ] = None,
    adjust_config: Annotated[
        bool,
        typer.Option(
            "--adjust-config",
            help="Scale the --config to the world size: batch size divided, learning rate "
            "multiplied, output directory per rank.",
            rich_help_panel=_L,
        ),
    ] = False,
    no_preflight: NoPreflightOpt = False,
    max_restarts: MaxRestartsOpt = 0,
    checkpoint_dir: CheckpointOpt = None,
    hang_timeout: HangTimeoutOpt = None,
    calibration: SubmitCalibrationOpt = None,
    rebalance: SubmitRebalanceOpt = False,
    plan_only: Annotated[
        bool,
        typer.Option("--plan-only", help="Print the plan (per-node commands); start nothing."),
    ] = False,
    follow_: Annotated[
        bool,
        typer.Option(
            "-f",
            "--follow",
            help="Follow the job's output until it ends; exit with its exit code.",
        ),
    ] = False,
    server: ServerOpt = DEFAULT_SERVER,
    token_file: TokenFileOpt = None,
) -> None:
    """Plan SCRIPT on the server's machines and start it; print the job id.

    The job id is the one line on stdout (JOB=$(corral job submit ...)); the chosen
    machines and the master go to stderr. With -f the output follows and the exit code
    is the job's, as for corral run.
    """
    body = _request(
        command,
        server=server,
        machines=machines,
        machine=machine,
        gpus_per_machine=gpus_per_machine,
        nproc_per_node=nproc_per_node,
        launcher=launcher,
        command_template=command_template,
        env=env,
        secret_env=secret_env,
        workdir=workdir,
        python=python,
        max_restarts=max_restarts,
        checkpoint_dir=checkpoint_dir,
        hang_timeout=hang_timeout,
        timeout=timeout,
        no_preflight=no_preflight,
        name=name,
        config=config,
        adjust_config=adjust_config,
        calibration=calibration,
        rebalance=rebalance,
    )
    client = _client(server, token_file)
    try:
        planned = client.call("POST", "/api/network/distributed/plan", json=body)
        job_id = str(planned["job_id"])
        plan = planned["execution_plan"]
        err = make_console()
        if plan_only:
            _print_plan(plan, make_console(stderr=False))
            say(err, f"job {job_id} is planned, not started (corral job stop {job_id} drops it)")
            return
        try:
            client.call("POST", "/api/network/distributed/dispatch", json={"job_id": job_id})
        except CorralError:
            with contextlib.suppress(CorralError):  # do not leave the planned job behind
                client.call("POST", f"/api/network/distributed/stop/{job_id}")
            raise
        say(err, _describe(plan))
        if plan.get("workload_weights"):
            say(err, _weights_line(plan))
        sys.stdout.write(job_id + "\n")
        sys.stdout.flush()
        if follow_:
            raise typer.Exit(follow(client, job_id))
    finally:
        client.close()


def list_jobs(
    status: Annotated[
        str | None,
        typer.Option(
            "--status",
            metavar="STATE",
            help="Only jobs in these states (comma-separated: running,failed,...).",
        ),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", metavar="N", min=1, max=1000, help="At most N jobs.")
    ] = 20,
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token_file: TokenFileOpt = None,
) -> None:
    """List the server's jobs, newest first."""
    client = _client(server, token_file)
    try:
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = status
        page = client.call("GET", "/api/jobs", params=params)
    finally:
        client.close()
    if as_json:
        _print_json(page)
        return
    if not page["jobs"]:
        say(make_console(), "no jobs" + (f" {status}" if status else ""), "dim")
        return
    table = Table(title=f"{len(page['jobs'])} of {page['total']} jobs", title_justify="left")
    for column in ("job", "name", "status", "machines", "ranks", "duration", "exit"):
        table.add_column(column, overflow="fold")
    for job in page["jobs"]:
        code = job.get("exit_code")
        table.add_row(
            job["job_id"],
            job.get("name") or "",
            _state(str(job["status"])),
            ",".join(job.get("machines") or []),
            str(job.get("world_size") or "-"),
            duration_text(job.get("duration")),
            "-" if code is None else str(code),
        )
    make_console(stderr=False).print(table)


def status(
    job_id: JobArg,
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token_file: TokenFileOpt = None,
) -> None:
    """Show a job's status: master, nodes and their progress, attempts, root cause.

    Exit code: 0 while the job runs; once it has ended, its exit code as corral run
    would have exited (255 when it was lost).
    """
    client = _client(server, token_file)
    try:
        data = client.call("GET", f"/api/jobs/{job_id}")
    finally:
        client.close()
    if as_json:
        _print_json(data)
    else:
        print_status(data, make_console(stderr=False))
    raise typer.Exit(exit_code_of(data))


def _line_wanted(line: str, host: str | None, rank: int | None) -> bool:
    """Whether a merged ``[host:rank] text`` line passes the --host / --rank filter."""
    if host is None and rank is None:
        return True
    label, sep, _ = line.partition("] ")
    if not sep or not label.startswith("["):
        return False
    name, colon, number = label[1:].partition(":")
    line_rank = int(number) if colon and number.lstrip("-").isdigit() else -1
    return _wanted(name, line_rank, host, rank)


def logs(
    job_id: JobArg,
    follow_: Annotated[
        bool,
        typer.Option(
            "-f",
            "--follow",
            help="Follow the output live until the job ends; exit with its exit code.",
        ),
    ] = False,
    host: Annotated[
        str | None, typer.Option("--host", metavar="HOST", help="Only this host.")
    ] = None,
    rank: Annotated[
        int | None, typer.Option("--rank", metavar="N", help="Only this global rank.")
    ] = None,
    server: ServerOpt = DEFAULT_SERVER,
    token_file: TokenFileOpt = None,
) -> None:
    """Print a job's output, each line prefixed [host:rank].

    With -f: follow it until the job ends (resuming after a dropped connection), then
    exit as corral run would: 0 success, the failing rank's code, 124 timeout, 130
    cancelled, 255 lost, 3 could not start.
    """
    client = _client(server, token_file)
    try:
        if follow_:
            raise typer.Exit(follow(client, job_id, host=host, rank=rank))
        offset = 0
        out = sys.stdout
        while True:
            page = client.call(
                "GET",
                f"/api/network/local_job_output/{job_id}",
                params={"offset": offset, "limit": PAGE_LINES},
            )
            for line in page["lines"]:
                if _line_wanted(line, host, rank):
                    out.write(line + "\n")
            if page["next_offset"] <= offset:
                break
            offset = page["next_offset"]
        out.flush()
    finally:
        client.close()


def stop(
    job_id: JobArg,
    force: Annotated[
        bool, typer.Option("--force", help="Kill every rank now instead of a graceful stop.")
    ] = False,
    server: ServerOpt = DEFAULT_SERVER,
    token_file: TokenFileOpt = None,
) -> None:
    """Stop a job on every node (a job that has ended is left as it is)."""
    client = _client(server, token_file)
    try:
        answer = client.call(
            "POST",
            f"/api/network/distributed/stop/{job_id}",
            params={"force": "true"} if force else None,
        )
    finally:
        client.close()
    sys.stdout.write(str(answer.get("message") or answer) + "\n")


job_app = typer.Typer(
    name="job",
    help="Submit, watch and stop jobs on a corral server (corral serve).",
    no_args_is_help=True,
    rich_markup_mode="rich",
)


def register(app: typer.Typer) -> None:
    """Add the ``job`` group (submit, list, status, logs, stop) to ``app``."""
    job_app.command("submit", context_settings={"allow_interspersed_args": False})(submit)
    job_app.command("list")(list_jobs)
    job_app.command("status")(status)
    job_app.command("logs")(logs)
    job_app.command("stop")(stop)
    app.add_typer(job_app, name="job")
