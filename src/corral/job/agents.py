"""Start every SSH host's agent and check the host before anything is launched.

One session per host: a tiny shell picks the Python interpreter (``--python``,
else the coordinator's own interpreter path when it exists there, else
``python3``) and execs ``python -m corral.agent`` with it (so corral is
importable by it, or the host is named with the import error). The agent first
answers a probe: its interpreter, whether torch is there (torchrun launcher),
whether ``--workdir`` exists and, on the master host, whether the master port
is free (port 0: it picks one), and the version of corral it runs, which must
be the coordinator's (the two speak one protocol). The agent's environment carries
the job's ``CORRAL_JOB_ID``: the pre-flight running meanwhile does not take it
for a leftover of an earlier job. Only when every host is
ready does the coordinator send each agent its start message; otherwise every
agent is told to exit and the problems are one LaunchError naming each host.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import corral
from corral.agent.gate import split_argv
from corral.agent.probe import read_answer
from corral.agent.protocol import EVENT, encode_op, read_frame
from corral.checks.gather import AgentSessions
from corral.cluster.model import Cluster, Host
from corral.contract import JOB_ID_ENV
from corral.errors import CorralError, LaunchError
from corral.job.resolve import Prepared, plan_attempt
from corral.plan.render import master_index
from corral.plan.spec import JobSpec
from corral.remote.python import agent_argv, candidates
from corral.transport.base import NodeProcess, Transport

PROBE_TIMEOUT = 60.0
#: The plan of a node to start held at its gates while the checklist runs, a node
#: command's JSON: called with None for the one sent with the probe, then with the
#: probe's answer for one sent after it (None: nothing to send).
Prestart = Callable[["HostProbe | None"], Mapping[str, Any] | None]


@dataclass(frozen=True)
class HostProbe:
    """What one host's agent reported (``facts``: the pre-flight's host facts, when
    the probe asked for them and the agent could gather them, in ``facts_s``)."""

    host: str
    python: str
    hostname: str
    has_torch: bool
    workdir_ok: bool
    port: int | None
    port_error: str | None = None
    version: str | None = None
    facts: dict[str, Any] | None = None
    facts_s: float = 0.0  # how long the agent took to gather them


class AgentSession:
    """The pre-flight's session with a host, over its agent's own channel: the facts
    its probe carried, and the checklist's requests until the start message
    (:class:`~corral.checks.gather.HostSession`; :mod:`corral.agent.hostcheck`)."""

    def __init__(self, proc: NodeProcess, facts: dict[str, Any], start_s: float) -> None:
        self.proc = proc
        self.facts = facts
        self.start_s: float | None = start_s

    async def ask(self, op: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        """Send one request and read the agent's answer (one event frame)."""
        self.proc.write(encode_op(op))

        async def answer() -> dict[str, Any] | None:
            frame = await read_frame(self.proc.stdout)
            if frame is None:
                return None
            data = json.loads(frame[2])
            return data if frame[0] == EVENT and isinstance(data, dict) else None

        try:
            return await asyncio.wait_for(answer(), timeout)
        except (ValueError, asyncio.IncompleteReadError):
            return None


class VersionMismatch(LaunchError):
    """A host's agent runs another corral version than the coordinator."""

    def __init__(self, host: str, agent: str | None, coordinator: str) -> None:
        self.agent_version = agent
        self.coordinator_version = coordinator
        runs = f"corral {agent}" if agent else "an older corral (no version in its answer)"
        super().__init__(
            f"{host} runs {runs}, this coordinator {coordinator}: install the same "
            "version on every host (or corral sync)"
        )
        self.host = host


async def _probe_reply(proc: NodeProcess, host: Host, python: str | None) -> HostProbe:
    try:
        frame = await read_frame(proc.stdout)
        raw = json.loads(frame[2]) if frame is not None else None
    except (ValueError, asyncio.IncompleteReadError) as exc:
        raise LaunchError(
            f"unexpected output before the corral agent answered ({str(exc)[:120]}); does "
            "the login shell print something to stdout for non-interactive sessions?",
            host=host.name,
        ) from exc
    if frame is None:
        err = (await proc.stderr.read()).decode(errors="replace").strip()
        code = await proc.wait()
        last = err.splitlines()[-1] if err else f"exit {code}"
        if "No module named" in err:
            last = (
                f"corral cannot be imported ({last}); install it there "
                f"(`python -m pip install corral`) or pass --python "
                f"(tried: {', '.join(candidates(python))})"
            )
        raise LaunchError(f"could not start the corral agent: {last}", host=host.name)
    if frame[0] != EVENT or not isinstance(raw, dict) or raw.get("event") != "probe":
        raise LaunchError(f"unexpected first message from the agent: {raw!r:.200}", host=host.name)
    # the version first: another version's answer may not have the fields this one reads
    version = raw.get("version")
    if version != corral.__version__:
        raise VersionMismatch(host.name, str(version)[:40] if version else None, corral.__version__)
    try:
        event = read_answer(raw)
    except ValueError as exc:
        raise LaunchError(str(exc), host=host.name) from None
    facts = raw.get("facts")
    facts_s = raw.get("facts_s")
    return HostProbe(
        host=host.name,
        python=event["executable"],
        hostname=event["hostname"],
        has_torch=event["torch"],
        workdir_ok=event["workdir_ok"],
        port=event["port"],
        port_error=event["port_error"],
        version=event["version"],
        facts=facts if isinstance(facts, dict) else None,
        facts_s=float(facts_s) if isinstance(facts_s, (int, float)) else 0.0,
    )


async def start_agent(
    transport: Transport,
    host: Host,
    *,
    python: str | None,
    workdir: str | None,
    port: int | None,
    job_id: str | None = None,
    argv: Sequence[str] | None = None,
    checks: AgentSessions | None = None,
    prestart: Prestart | None = None,
) -> tuple[NodeProcess, HostProbe]:
    """Start ``host``'s agent (with ``CORRAL_JOB_ID=job_id`` in its environment, so
    the pre-flight's stale check knows it as this job's) and read its probe
    (TransportError / LaunchError). ``argv``: the agent's command when the
    interpreter is known (default: :func:`agent_argv`, the first one found).
    ``checks``: the pre-flight running meanwhile; the probe carries the host's
    facts when it asks for them, and the agent's session answers it. ``prestart``: the
    node's plan while the checklist runs (:data:`Prestart`), whose processes the
    agent starts held at their gates (:mod:`corral.agent.prestart`)."""
    started = time.monotonic()
    try:
        env = {JOB_ID_ENV: job_id} if job_id else None
        proc = await transport.start(host, list(argv or agent_argv(python)), env=env)
    except BaseException as exc:
        if checks is not None:  # unreachable: the checklist reports it, trying no more
            checks.answered(host.name, str(exc) if isinstance(exc, CorralError) else None)
        raise
    try:
        probe = await asyncio.wait_for(
            _probe(proc, host, python, workdir, port, checks, prestart), PROBE_TIMEOUT
        )
        node = prestart(probe) if prestart is not None else None
        if node is not None:  # a plan the probe's answer corrected
            proc.write(encode_op({"op": "prestart", "node": node}))
    except BaseException as exc:
        abort(proc)
        if checks is not None:  # no facts: the checklist asks the host its own way
            checks.answered(host.name, None)
        if isinstance(exc, asyncio.TimeoutError):
            raise LaunchError(
                f"the agent did not answer within {PROBE_TIMEOUT:g} s", host=host.name
            ) from exc
        raise
    if checks is not None:
        session = None
        if probe.facts is not None:  # the session's start: the probe's round trip
            start_s = max(0.0, time.monotonic() - started - probe.facts_s)
            session = AgentSession(proc, probe.facts, start_s)
        checks.answered(host.name, session)
    return proc, probe


async def _probe(
    proc: NodeProcess,
    host: Host,
    python: str | None,
    workdir: str | None,
    port: int | None,
    checks: AgentSessions | None,
    prestart: Prestart | None = None,
) -> HostProbe:
    op: dict[str, Any] = {"op": "probe", "workdir": workdir, "port": port}
    node = prestart(None) if prestart is not None else None
    if node is not None:
        op["prestart"] = node
    facts = checks.params(host.name) if checks is not None else None
    if facts is not None:
        op["facts"] = facts
    proc.write(encode_op(op))
    return await _probe_reply(proc, host, python)


def abort(proc: NodeProcess) -> None:
    """Tell an agent that answered its probe to exit without starting anything."""
    proc.write(encode_op({"op": "abort"}))
    proc.close_stdin()


def problems(
    probe: HostProbe,
    *,
    need_torch: bool,
    workdir: str | None,
    port: int | None,
    workdir_given: bool = True,
) -> list[str]:
    """Human-readable problems found by a probe (empty when the host is ready)."""
    found = []
    if need_torch and not probe.has_torch:
        found.append(
            f"torch is not installed for {probe.python}, so torchrun is missing; install it "
            "there or use --launcher python"
        )
    if workdir and not probe.workdir_ok:
        if workdir_given:
            found.append(f"--workdir {workdir} does not exist")
        else:
            found.append(
                f"working directory {workdir} (this machine's current directory, "
                "the default) does not exist there; pass --workdir"
            )
    if port is not None and probe.port is None:
        found.append(
            f"master port {port} cannot be bound ({probe.port_error}); pass another "
            "--master-port, or 0 to pick a free one"
        )
    return found


async def start_agents(
    transport: Transport,
    hosts: Sequence[Host],
    *,
    python: str | None,
    workdir: str | None,
    master: Host,
    master_port: int | None,
    need_torch: bool,
    workdir_given: bool = True,
    job_id: str | None = None,
    checks: AgentSessions | None = None,
    prestart: Callable[[str, HostProbe | None], Mapping[str, Any] | None] | None = None,
) -> dict[str, tuple[NodeProcess, HostProbe]]:
    """Start and probe every host's agent in parallel (``master_port`` None: the
    master port is not tested; ``job_id``, ``checks``: see :func:`start_agent`;
    ``prestart(host, probe)``: the host's :data:`Prestart`). If
    any host is not ready, every agent is aborted and one LaunchError lists each
    host's problem."""

    async def one(host: Host) -> tuple[NodeProcess, HostProbe]:
        port = master_port if host.name == master.name else None
        return await start_agent(
            transport,
            host,
            python=python,
            workdir=workdir,
            port=port,
            job_id=job_id,
            checks=checks,
            prestart=functools.partial(prestart, host.name) if prestart else None,
        )

    results = await asyncio.gather(*(one(h) for h in hosts), return_exceptions=True)
    errors: list[str] = []
    started: dict[str, tuple[NodeProcess, HostProbe]] = {}
    for host, result in zip(hosts, results, strict=True):
        if isinstance(result, VersionMismatch):
            errors.append(str(result))
        elif isinstance(result, CorralError):
            text = str(result)
            errors.append(text if text.startswith(f"{host.name}:") else f"{host.name}: {text}")
        elif isinstance(result, BaseException):
            raise result
        else:
            started[host.name] = result
            port = master_port if host.name == master.name else None
            errors += [
                f"{host.name}: {p}"
                for p in problems(
                    result[1],
                    need_torch=need_torch,
                    workdir=workdir,
                    port=port,
                    workdir_given=workdir_given,
                )
            ]
    if errors:
        if checks is not None:
            await checks.finished()  # the checklist may still be asking them
        for proc, _ in started.values():
            abort(proc)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*(proc.wait() for proc, _ in started.values())), 10
            )
        if len(errors) == 1:
            raise LaunchError(errors[0])
        raise LaunchError(f"{len(errors)} problems before launch:\n  " + "\n  ".join(errors))
    return started


def held_nodes(
    spec: JobSpec, cluster: Cluster, attempt: int, python: str | None
) -> Callable[[str, HostProbe | None], dict[str, Any] | None]:
    """Each SSH host's :data:`Prestart` (``f(host, probe)``): before its probe (None)
    its plan with the interpreter its agent is most likely started with (the first
    of :func:`~corral.remote.python.candidates`; port 0 stays 0 until the start
    message, read after the gates), one plan for every host; after the probe, a
    plan only if its interpreter is another one. None: nothing to send, or the
    command cannot be held."""
    guess = candidates(python)[0]
    guessed: dict[str, dict[str, Any] | None] = {}

    def plan(found: str, only: str | None) -> dict[str, dict[str, Any] | None]:
        hosts = tuple(
            dataclasses.replace(h, python=found) if only in (None, h.name) else h
            for h in cluster.hosts
        )
        try:
            commands = plan_attempt(spec, Cluster(hosts, source=cluster.source), attempt).commands
        except CorralError:
            return {}  # the start message's plan reports it
        return {c.host.name: c.to_json() if split_argv(c.argv) else None for c in commands}

    def node(name: str, probe: HostProbe | None) -> dict[str, Any] | None:
        if probe is None:
            if not guessed:
                guessed.update(plan(guess, None) or {"": None})
            return guessed.get(name)
        if probe.python == guess:
            return None  # the plan sent with the probe was right
        return plan(probe.python, name).get(name)

    return node


def _with_probe(node: Mapping[str, Any] | None) -> Prestart | None:
    """A local node's :data:`Prestart`: its plan, sent with the probe."""
    if node is None:
        return None
    return lambda probe: node if probe is None else None


async def start_remote(
    transport: Transport,
    prepared: Prepared,
    cluster: Cluster,
    *,
    python: str | None,
    check_port: bool = True,
    agents: AgentSessions | None = None,
    held: bool = False,
) -> tuple[Prepared, dict[str, NodeProcess]]:
    """Start and probe every SSH host's agent (interpreter, torch, workdir, corral's
    version, master port unless ``check_port`` is False; port 0 is always
    resolved; ``agents``: the checklist running meanwhile, which they answer)
    and re-plan with what they found. Nothing is launched if a host is not
    ready. ``held``: each host's processes are started once its agent answered,
    held at their gates until the start message."""
    spec = prepared.spec
    master_addr = spec.master_addr or cluster.hosts[0].address
    master = cluster.hosts[master_index(cluster, master_addr)]
    prestart = held_nodes(spec, cluster, prepared.attempt, python)
    started = await start_agents(
        transport,
        cluster.hosts,
        python=python,
        workdir=prepared.commands[0].cwd,  # --workdir, or this machine's current directory
        workdir_given=spec.workdir is not None,
        master=master,
        master_port=spec.master_port if check_port or spec.master_port == 0 else None,
        need_torch=spec.launcher == "torchrun",
        job_id=spec.job_id,  # the pre-flight's stale check must not count them
        checks=agents,
        prestart=prestart if held else None,
    )
    resolved = Cluster(
        tuple(dataclasses.replace(h, python=started[h.name][1].python) for h in cluster.hosts),
        source=cluster.source,
    )
    if spec.master_port == 0:
        port = started[master.name][1].port
        assert port is not None
        spec = dataclasses.replace(spec, master_port=port)
    planned = plan_attempt(spec, resolved, prepared.attempt)
    return planned, {name: proc for name, (proc, _) in started.items()}


T = TypeVar("T")
P = TypeVar("P")


async def abort_all(procs: Iterable[NodeProcess]) -> None:
    """Tell agents that were started (and probed) to exit without launching."""
    waiting = []
    for proc in procs:
        abort(proc)
        waiting.append(proc.wait())
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 10)


async def start_local_agents(
    transport: Transport,
    hosts: Sequence[Host],
    argv: Callable[[Host], list[str]],
    job_id: str | None,
    checks: AgentSessions | None = None,
    prestart: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, NodeProcess]:
    """Start and probe the agents of simulated (``local:N``) nodes with ``argv(host)``,
    the supervisor's own command: their interpreter start and imports happen before
    the launch (``checks``: see :func:`start_agent`; ``prestart``: each host's plan,
    sent with its probe). A node whose agent did not
    answer is left out (the supervisor starts it, and reports its failure, as
    without this head start)."""

    async def one(host: Host) -> NodeProcess:
        proc, _ = await start_agent(
            transport,
            host,
            python=None,
            workdir=None,
            port=None,
            job_id=job_id,
            argv=argv(host),
            checks=checks,
            prestart=_with_probe((prestart or {}).get(host.name)),
        )
        return proc

    results = await asyncio.gather(*(one(h) for h in hosts), return_exceptions=True)
    started: dict[str, NodeProcess] = {}
    for host, result in zip(hosts, results, strict=True):
        if isinstance(result, BaseException):
            if not isinstance(result, CorralError):
                await abort_all(started.values())
                raise result
        else:
            started[host.name] = result
    return started


async def alongside(
    checks: Awaitable[T], agents: Awaitable[tuple[P, dict[str, NodeProcess]]]
) -> tuple[T, tuple[P, dict[str, NodeProcess]]]:
    """Run the checklist and the agents' start-up at the same time; the checklist's
    outcome and the agents started. If either fails (the checklist's error first)
    or this is cancelled meanwhile, every agent started is told to exit.

    The agents' processes are started first (their interpreters, and the node's
    launcher held at its gate, start sooner): the checklist's first step imports its
    machinery (~40 modules) before it awaits anything."""
    starting = asyncio.ensure_future(agents)
    checking: asyncio.Future[T] | None = None
    try:
        await asyncio.sleep(0)  # the agents' start-up runs its first step (its spawns)
        checking = asyncio.ensure_future(checks)
        outcome, started = await asyncio.gather(checking, starting, return_exceptions=True)
    except asyncio.CancelledError:
        if checking is not None:
            checking.cancel()
        elif inspect.iscoroutine(checks):
            checks.close()  # never started
        starting.cancel()
        done = await asyncio.gather(starting, return_exceptions=True)
        if not isinstance(done[0], BaseException):
            await abort_all(done[0][1].values())
        raise
    if isinstance(outcome, BaseException) or isinstance(started, BaseException):
        if not isinstance(started, BaseException):
            await abort_all(started[1].values())
        raise outcome if isinstance(outcome, BaseException) else started  # type: ignore[misc]
    return outcome, started
