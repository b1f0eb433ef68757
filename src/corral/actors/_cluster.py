"""The coordinator's API: :class:`Cluster`, :class:`NodeConfig`, :class:`WorkerHandle`
and the local :class:`Worker` (synchronous; the work happens on a loop thread,
see :mod:`corral.actors._runtime`)."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import secrets
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import corral
from corral.actors import _framing as fr
from corral.actors._channel import Mailbox
from corral.actors._loop import LoopThread, Output
from corral.actors._runtime import WorkerSpec, WorkerSupervisor, start_all
from corral.actors._workfn import describe
from corral.actors.errors import (
    ActorError,
    ActorGroupError,
    ActorStartError,
    ActorTimeout,
    WorkerDied,
)
from corral.actors.nccl import NCCLConfig, create_nccl_configs
from corral.cluster import Cluster as HostCluster
from corral.cluster import Host, load_cluster
from corral.contract import ACTOR_ENV
from corral.errors import ConfigError
from corral.job.schema import JobOptions
from corral.job.states import JobState
from corral.recovery.restart import RestartPolicy
from corral.remote.python import candidates
from corral.transport.base import Transport
from corral.transport.choose import transport_for
from corral.transport.options import SshOptions

WorkFn = Callable[..., Any] | str

#: The file every worker runs (the job's script, as the builder plans it).
WORKER_FILE = str(Path(__file__).with_name("worker.py"))
#: ``Cluster(run_dir=...)`` not given: the options' ``run_dir``.
_OPTIONS_RUN_DIR = ""

#: Seconds the other workers of a group operation get once one has failed.
GROUP_GRACE = 5.0

_SHELL = (
    'for p in "$@"; do if command -v "$p" >/dev/null 2>&1; then exec "$p" -m '
    'corral.actors.worker; fi; done; echo "no python interpreter found (tried: $*)" >&2; exit 127'
)


def worker_argv(python: str | None) -> list[str]:
    """The command that starts a worker with the first interpreter found on the host."""
    return ["sh", "-c", _SHELL, "corral-actor", *candidates(python)]


@dataclass
class NodeConfig:
    """One node: its host (an ssh name or alias), how many workers run there, and
    optionally the interpreter, extra environment, working directory and network
    interface. ``base_port`` is accepted for the seed's code and unused: workers
    talk over their SSH session, no port is opened."""

    host: str
    num_workers: int = 1
    base_port: int | None = None
    python: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    interface: str | None = None

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ConfigError(f"{self.host}: num_workers={self.num_workers}; expected >= 1")


_S = TypeVar("_S", bound="_StopsOnExit")


class _StopsOnExit(ABC):
    """``with``: :meth:`stop` on the way out."""

    @abstractmethod
    def stop(self, grace: float | None = None) -> None:
        """Ask the worker(s) to finish, wait up to ``grace`` seconds (None: the job's
        ``grace``), then kill."""

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.monotonic()


def _raise(error: ActorError) -> Any:
    raise error.with_traceback(None)


def restart_policy(max_restarts: int | RestartPolicy) -> RestartPolicy:
    """The job engine's restart policy for ``max_restarts`` (an int: that many
    restarts, each at once; a RestartPolicy: as given, backoff included)."""
    if isinstance(max_restarts, RestartPolicy):
        return max_restarts
    return RestartPolicy(max_restarts=max_restarts, backoff=0.0)


class WorkerHandle:
    """The coordinator's handle on one worker: ``send``, ``recv``, ``poll``,
    ``alive``, ``host``, ``rank`` (global), ``local_rank``, ``node_rank``, ``pid``,
    ``restarts``, ``last_report`` (the latest ``corral.sdk.report``) and ``result``
    (what work_fn returned)."""

    def __init__(self, supervisor: WorkerSupervisor, runtime: LoopThread) -> None:
        self._sup = supervisor
        self._runtime = runtime
        self._mailbox = supervisor.mailbox

    def __repr__(self) -> str:
        state = "alive" if self.alive else "dead"
        return f"WorkerHandle(host={self.host!r}, rank={self.rank}, {state})"

    @property
    def host(self) -> str:
        """The host's name (as in the hostfile or NodeConfig)."""
        return self._sup.host

    @property
    def rank(self) -> int:
        """Global rank."""
        return self._sup.rank

    @property
    def local_rank(self) -> int:
        return self._sup.spec.local_rank

    @property
    def node_rank(self) -> int:
        return self._sup.spec.node_rank

    @property
    def alive(self) -> bool:
        """Whether the worker process is running."""
        return self._sup.alive and self._mailbox.dead is None

    @property
    def pid(self) -> int | None:
        """The worker's PID on its host."""
        pid = self._sup.hello.get("pid")
        return int(pid) if pid is not None else None

    @property
    def interface(self) -> str | None:
        """The network interface toward the master (hostfile, else detected)."""
        found = self._sup.hello.get("interface")
        return str(found) if found else None

    @property
    def restarts(self) -> int:
        """How many times the worker was restarted (``max_restarts``)."""
        return self._sup.restarts

    @property
    def state(self) -> JobState:
        """Where the worker is, in the job engine's states: STARTING, RUNNING,
        STOPPING, RESTARTING, then SUCCEEDED (work_fn returned), FAILED or
        CANCELLED (stopped)."""
        return self._sup.machine.state

    @property
    def restarted(self) -> bool:
        return self._sup.restarts > 0

    @property
    def last_report(self) -> dict[str, Any] | None:
        """The latest ``corral.sdk.report`` of the worker (step, total, metrics)."""
        return self._sup.last_report

    @property
    def result(self) -> Any:
        """What work_fn returned, once it has (else None)."""
        body = self._sup.result
        return None if body is None else fr.loads(body)

    # -- messages ---------------------------------------------------------------------

    def send(self, obj: object) -> None:
        """Send ``obj`` (pickled here) to the worker; raises WorkerDied if it is gone."""
        self._send_body(fr.dumps(obj))

    def _send_body(self, body: bytes) -> int:
        """Send a pickled message; its id (what the worker's answers carry)."""
        if self._mailbox.dead is not None:
            _raise(self._mailbox.dead)
        return self._sup.send_msg(body)

    def recv(self, timeout: float | None = None) -> Any:
        """The next message from the worker. Raises RemoteError (work_fn raised),
        WorkerDied (the process is gone), WorkerRestarted, or ActorTimeout after
        ``timeout`` seconds. Answers to a failed :meth:`Cluster.call` never come here."""
        start = time.monotonic()
        deadline = _deadline(timeout)
        with self._mailbox.cond:
            while not self._mailbox.ready():
                left = _left(deadline)
                if left is not None and left <= 0:
                    raise ActorTimeout(
                        host=self.host,
                        rank=self.rank,
                        timeout=timeout or 0.0,
                        waited=time.monotonic() - start,
                    )
                self._mailbox.cond.wait(left)
            item = self._mailbox.take()
        return self._open(item)

    def poll(self, timeout: float = 0.0) -> bool:
        """Whether :meth:`recv` would return or raise at once (waits up to ``timeout``)."""
        with self._mailbox.cond:
            return self._mailbox.cond.wait_for(self._mailbox.ready, timeout)

    @staticmethod
    def _open(item: tuple[str, Any]) -> Any:
        kind, value = item
        if kind == "msg":
            return fr.msg_value(value[1])
        return _raise(value)


def _where(handle: WorkerHandle) -> str:
    return f"[{handle.host}:{handle.rank}]"


def _gather(
    handles: Sequence[WorkerHandle],
    timeout: float | None,
    operation: str,
    requests: Mapping[int, int] | None = None,
) -> list[Any]:
    """One message from each handle, in order; one ActorGroupError naming every
    worker that failed, root cause first (after the first failure the rest get
    :data:`GROUP_GRACE` s). ``requests`` (rank -> message id, a call's): only
    answers to that message count (earlier messages stay for ``recv``), and the
    answers of a worker still owing one when this fails are dropped, now and when
    they come."""
    if not handles:
        return []
    requests = requests or {}
    start = time.monotonic()
    deadline = _deadline(timeout)
    items: dict[int, tuple[str, Any]] = {}
    errors: dict[int, ActorError] = {}
    failed: list[WorkerHandle] = []
    pending = list(handles)
    cond = handles[0]._mailbox.cond
    with cond:
        try:
            while pending:
                for handle in pending[:]:
                    since = requests.get(handle.rank, 0)
                    if not handle._mailbox.ready(since):
                        continue
                    items[handle.rank] = handle._mailbox.take(since)
                    pending.remove(handle)
                    if items[handle.rank][0] != "msg":
                        failed.append(handle)
                        if len(failed) == 1:
                            grace = time.monotonic() + GROUP_GRACE
                            deadline = grace if deadline is None else min(deadline, grace)
                if not pending:
                    break
                left = _left(deadline)
                if left is not None and left <= 0:
                    waited = time.monotonic() - start
                    note = ""
                    if failed and (timeout is None or waited < timeout):
                        note = f"gave up {GROUP_GRACE:g} s after {_where(failed[0])} failed"
                        if timeout is not None:
                            note += f"; timeout={timeout:g} s"
                    for handle in pending:
                        errors[handle.rank] = ActorTimeout(
                            host=handle.host,
                            rank=handle.rank,
                            timeout=timeout or GROUP_GRACE,
                            waited=waited,
                            note=note,
                        )
                    break
                cond.wait(left)
        finally:  # given up (timed out, interrupted): late answers must not linger
            for handle in pending:
                if handle.rank in requests:
                    handle._mailbox.abandon(requests[handle.rank])
    results: dict[int, Any] = {}
    for rank, item in items.items():
        try:
            results[rank] = WorkerHandle._open(item)
        except ActorError as exc:
            errors[rank] = exc
    if errors:
        raise ActorGroupError(operation, errors, results, [h.rank for h in failed])
    return [results[h.rank] for h in handles]


class Cluster(_StopsOnExit):
    """Workers on every node, driven from this process.

    ``Cluster(nodes=[NodeConfig(host, num_workers, ...)], ssh=SshOptions(...))`` or
    :meth:`from_hosts` (a corral hostfile, ``h1,h2`` or ``local:N``). ``local=True``
    runs every node as local processes. ``options``: the job's options, as ``corral
    run`` takes them (:class:`~corral.job.schema.JobOptions`: ``env``,
    ``collective_timeout``, ``checkpoint_dir``, ``max_restarts``, ``grace``... see
    docs/actors.md); the workers are planned from them by the one builder
    (:func:`corral.job.build.ready_ranks`). ``master_addr``, ``master_port``,
    ``host_timeout`` and ``run_dir``, when given, set those options: ``master_addr``
    defaults to the first node's address, ``master_port`` 0 to a free port (local) or
    29500 (SSH). A host that stops answering is declared lost after ``host_timeout``
    seconds (its workers' ``recv`` raise WorkerDied), and workers that hear no
    heartbeat from this process for twice that exit, with everything they started.
    Worker stderr goes to this process's stderr as ``[host:rank]`` lines (``echo``)
    and to ``<run_dir>/actors-<id>/logs/<host>.<rank>.log`` (``run_dir=None``: no
    files); ``on_report(rank, report)`` is called (on the loop thread) for every
    ``corral.sdk.report`` of a worker.
    """

    def __init__(
        self,
        nodes: Sequence[NodeConfig],
        ssh: SshOptions | None = None,
        *,
        local: bool = False,
        master_addr: str | None = None,
        master_port: int | None = None,
        host_timeout: float | None = None,
        run_dir: str | Path | None = _OPTIONS_RUN_DIR,
        echo: bool = True,
        on_report: Callable[[int, dict[str, Any]], None] | None = None,
        options: JobOptions | None = None,
    ) -> None:
        if not nodes:
            raise ConfigError("no nodes: expected at least one NodeConfig")
        names = [n.host for n in nodes]
        if len(set(names)) != len(names):
            raise ConfigError(f"duplicate hosts in {names}")
        self.nodes = list(nodes)
        self.ssh = ssh or SshOptions()
        self.local = local
        self.id = time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)
        given: dict[str, Any] = {
            "master_addr": master_addr,
            "master_port": master_port,
            "host_timeout": host_timeout,
            "run_dir": None if run_dir in (None, _OPTIONS_RUN_DIR) else str(run_dir),
        }
        options = replace(
            options or JobOptions(), **{k: v for k, v in given.items() if v is not None}
        )
        #: The job's options (the builder's input): what ``start`` plans the workers from.
        self.options = replace(options, job_id=options.job_id or f"actors-{self.id}")
        self.run_dir = None if run_dir is None else Path(self.options.run_dir)
        self.echo = echo
        self.on_report = on_report
        self.workers: list[WorkerHandle] = []
        self._base_hosts: dict[str, Host] = {}
        self._runtime: LoopThread | None = None
        self._transport: Transport | None = None
        self._supervisors: list[WorkerSupervisor] = []
        self._output: Output | None = None
        self._configs: list[NCCLConfig] = []
        self._lock = threading.Lock()

    @classmethod
    def from_hosts(
        cls,
        hosts: str | Path,
        workers_per_host: int | None = None,
        *,
        ssh: SshOptions | None = None,
        python: str | None = None,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        **kwargs: Any,
    ) -> Cluster:
        """A cluster from a hostfile (any corral format), ``h1,h2,...`` or ``local:N``;
        each host runs ``workers_per_host`` workers (default: its slots)."""
        ssh = ssh or SshOptions()
        found = load_cluster(str(hosts), ssh_user=ssh.user, ssh_port=ssh.port)
        nodes = [
            NodeConfig(
                host=h.name,
                num_workers=workers_per_host or h.slots,
                python=python or h.python,
                env={**h.env, **(env or {})},
                workdir=workdir,
                interface=h.interface,
            )
            for h in found.hosts
        ]
        cluster = cls(nodes, ssh, local=found.is_local, **kwargs)
        cluster._base_hosts = {h.name: h for h in found.hosts}
        return cluster

    def __repr__(self) -> str:
        layout = ", ".join(f"{n.host}:{n.num_workers}" for n in self.nodes)
        return f"Cluster({layout}, id={self.id!r})"

    @property
    def job_id(self) -> str:
        """The options' ``job_id``, else ``actors-<id>``: every worker's ``CORRAL_JOB_ID``
        (so ``corral check`` knows its processes as a corral job's)."""
        return str(self.options.job_id)

    @property
    def master_addr(self) -> str | None:
        return self.options.master_addr

    @property
    def master_port(self) -> int:
        """The master port asked for (0: chosen at start, see :meth:`nccl_configs`)."""
        return self.options.master_port

    @property
    def host_timeout(self) -> float:
        return self.options.host_timeout

    @property
    def world_size(self) -> int:
        return sum(n.num_workers for n in self.nodes)

    @property
    def log_dir(self) -> Path | None:
        """Where the workers' log files go (None: none are written)."""
        return None if self.run_dir is None else self.run_dir / self.job_id / "logs"

    def _hosts(self) -> list[Host]:
        hosts = []
        for node in self.nodes:
            base = self._base_hosts.get(node.host) or Host(name=node.host, local=self.local)
            hosts.append(
                replace(
                    base,
                    slots=node.num_workers,
                    python=node.python or base.python,
                    interface=node.interface or base.interface,
                    env=dict(node.env),  # planned after the job's --env (the node's wins)
                )
            )
        return hosts

    def _make_transport(self, hosts: Sequence[Host]) -> Transport:
        transport = transport_for(HostCluster(hosts=tuple(hosts)), self.ssh)
        if not self.local:  # SSH: a silent host is declared lost after host_timeout
            from corral.transport.ssh import SshTransport

            if isinstance(transport, SshTransport):
                transport.keepalive_interval = max(self.host_timeout / 3, 0.5)
                transport.keepalive_count_max = 3
        return transport

    def nccl_configs(self) -> list[NCCLConfig]:
        """The NCCLConfig of every worker (rank order), with the interface each node
        uses toward the master (hostfile, else detected by the worker at start)."""
        if not self.workers:
            return list(self._configs)
        interfaces = []
        for node_rank in range(len(self.nodes)):
            first = next(w for w in self.workers if w.node_rank == node_rank)
            interfaces.append(first.interface)
        head = self._configs[0]
        return create_nccl_configs(
            head.master_addr,
            [(n.host, n.num_workers) for n in self.nodes],
            head.master_port,
            interfaces=interfaces,
        )

    # -- start and stop -----------------------------------------------------------------

    def _specs(self, work_fn: WorkFn) -> tuple[list[WorkerSpec], RestartPolicy]:
        """Every worker, planned from the options by the one builder (each one's env
        is the one ``corral run`` gives a rank), and the options' restart policy."""
        from corral.job.build import ready_ranks
        from corral.job.describe import JobDescription

        spec = describe(work_fn)
        hosts = self._hosts()
        description = JobDescription(self.options, HostCluster(hosts=tuple(hosts)), self.ssh)
        ready = ready_ranks(description, WORKER_FILE)
        self._configs = create_nccl_configs(
            ready.master_addr,
            [(n.host, n.num_workers) for n in self.nodes],
            ready.spec.master_port,
            interfaces=[h.interface for h in hosts],
        )
        specs = []
        for rank, config, node in zip(
            ready.ranks,
            self._configs,
            [n for n in self.nodes for _ in range(n.num_workers)],
            strict=True,
        ):
            init = {
                "version": corral.__version__,
                "host": rank.host.name,
                "rank": rank.rank,
                "local_rank": rank.local_rank,
                "world_size": config.world_size,
                "local_world_size": config.local_world_size,
                "node_rank": rank.node_rank,
                "work_fn": spec.to_json(),
                "workdir": node.workdir or ready.spec.workdir,
                "default_workdir": os.getcwd(),
                "master_addr": ready.master_addr,
                "interface": config.interface,
                # SSH: pings every host_timeout/3; a worker silent-for 2x host_timeout exits
                "heartbeat_every": 0 if self.local else self.host_timeout / 3,
                "heartbeat_timeout": None if self.local else 2 * self.host_timeout,
            }
            specs.append(
                WorkerSpec(
                    host=rank.host,
                    rank=rank.rank,
                    local_rank=rank.local_rank,
                    node_rank=rank.node_rank,
                    argv=worker_argv(rank.python),
                    env={**rank.env, ACTOR_ENV: "1", "PYTHONUNBUFFERED": "1"},
                    init=init,
                )
            )
        return specs, ready.policies.restarts

    def start(
        self,
        work_fn: WorkFn,
        wait_time: float = 60.0,
        *,
        max_restarts: int | RestartPolicy | None = None,
    ) -> list[WorkerHandle]:
        """Start every worker running ``work_fn(handle)`` and wait (at most
        ``wait_time`` s) until each is about to run it; the handles in rank order.

        ``work_fn``: a module-level function, ``"module.function"``,
        ``"module:function"``, ``"path/to/file.py:function"`` or
        ``"__main__.function"`` (this program's script, loaded on the host without
        running its ``__main__`` block). A worker that dies is started again up to
        ``max_restarts`` times (its next ``recv`` raises WorkerRestarted once): an
        int restarts at once, a :class:`~corral.recovery.restart.RestartPolicy`
        (the job engine's, ``--max-restarts``/``--restart-backoff``) waits its backoff;
        None: the options' ``max_restarts`` and ``restart_backoff``.
        Raises ActorStartError naming every worker that did not start (all are
        stopped then).
        """
        with self._lock:
            if self._runtime is not None:
                raise ConfigError("this cluster is already started: stop() it first")
            specs, policy = self._specs(work_fn)
            runtime = LoopThread(f"corral-actors-{self.id}")
            output = Output(echo=self.echo, log_dir=self.log_dir)
            self._runtime, self._output = runtime, output
        cond = threading.Condition()
        hosts = [s.host for s in specs]
        if max_restarts is not None:
            policy = restart_policy(max_restarts)

        async def boot() -> dict[int, ActorError]:
            self._transport = self._make_transport(hosts)
            self._supervisors = [
                WorkerSupervisor(
                    spec,
                    self._transport,
                    output,
                    Mailbox(cond),
                    policy=policy,
                    on_report=self.on_report,
                )
                for spec in specs
            ]
            return await start_all(self._supervisors, wait_time)

        try:
            failures = runtime.run(boot())
        except BaseException:
            self.stop(grace=0)
            raise
        if failures:
            self.stop(grace=0)
            raise ActorStartError(failures)
        self.workers = [WorkerHandle(sup, runtime) for sup in self._supervisors]
        atexit.register(self.stop)
        return list(self.workers)

    def stop(self, grace: float | None = None) -> None:
        """Send every worker a stop frame (its ``recv`` raises ``Stopped``), wait up to
        ``grace`` seconds (None: the options' ``grace``), then SIGKILL each one's process
        group; closes the connections. Safe to call twice."""
        if grace is None:
            grace = self.options.grace
        with self._lock:
            runtime, self._runtime = self._runtime, None
        if runtime is None:
            return
        atexit.unregister(self.stop)
        supervisors, transport = self._supervisors, self._transport

        async def shutdown() -> None:
            await asyncio.gather(*(s.stop(grace) for s in supervisors), return_exceptions=True)
            if transport is not None:
                await transport.close()

        with contextlib.suppress(TimeoutError, asyncio.TimeoutError, RuntimeError):
            runtime.run(shutdown(), timeout=grace + 60)
        runtime.close()
        if self._output is not None:
            self._output.close()
            self._output = None

    # -- group operations ----------------------------------------------------------------

    def _started(self) -> list[WorkerHandle]:
        if not self.workers:
            raise ConfigError("the cluster is not started: call start() first")
        return self.workers

    def _broadcast(self, obj: object) -> tuple[dict[int, int], dict[int, ActorError]]:
        """Send ``obj`` to every worker: the message ids (rank -> id) and the dead."""
        body = fr.dumps(obj)
        ids: dict[int, int] = {}
        errors: dict[int, ActorError] = {}
        for handle in self._started():
            try:
                ids[handle.rank] = handle._send_body(body)
            except WorkerDied as exc:
                errors[handle.rank] = exc
        return ids, errors

    def broadcast(self, obj: object) -> None:
        """Send ``obj`` (pickled once) to every worker; ActorGroupError names the dead
        (the others got it)."""
        if errors := self._broadcast(obj)[1]:
            raise ActorGroupError("broadcast", errors, {})

    def gather(self, timeout: float | None = None) -> list[Any]:
        """One message from every worker, in rank order. ActorGroupError names every
        worker that failed (died, raised, or sent nothing within ``timeout``; once
        one has failed the others get 5 s more) and carries the others' results."""
        return _gather(self._started(), timeout, "gather")

    def call(self, obj: object, timeout: float | None = None) -> list[Any]:
        """:meth:`broadcast` ``obj`` and :meth:`gather` the answers, in rank order;
        one ActorGroupError for every worker that failed either step, root cause
        first, with the answers that came in ``results``.

        Only an answer to this message counts (each worker's first message sent
        after it received it; what it sent before stays for ``recv``). Once the
        call has failed, the answers still owed are dropped when they come: a later
        ``recv`` never returns them."""
        ids, errors = self._broadcast(obj)
        live = [h for h in self._started() if h.rank not in errors]
        try:
            results = _gather(live, timeout, "call", ids)
        except ActorGroupError as exc:
            raise ActorGroupError(
                "call", {**errors, **exc.errors}, exc.results, [*errors, *exc.order]
            ) from None
        if errors:
            raise ActorGroupError(
                "call", errors, {h.rank: r for h, r in zip(live, results, strict=True)}
            )
        return results


class Worker(WorkerHandle, _StopsOnExit):
    """One worker process on this machine with the handle API (``send``, ``recv``,
    ``poll``, ``alive``, ...), started like a cluster's: ``Worker(work_fn)``. Code
    written against it moves to :class:`Cluster` unchanged."""

    def __init__(
        self,
        work_fn: WorkFn,
        *,
        wait_time: float = 60.0,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        python: str | None = None,
        echo: bool = True,
        run_dir: str | Path | None = None,
        max_restarts: int | RestartPolicy | None = None,
        options: JobOptions | None = None,
    ) -> None:
        node = NodeConfig("local", 1, python=python, env=dict(env or {}), workdir=workdir)
        self.cluster = Cluster([node], local=True, run_dir=run_dir, echo=echo, options=options)
        (handle,) = self.cluster.start(work_fn, wait_time, max_restarts=max_restarts)
        super().__init__(handle._sup, handle._runtime)

    def stop(self, grace: float | None = None) -> None:
        """Stop the worker (see :meth:`Cluster.stop`)."""
        self.cluster.stop(grace)


__all__ = ["Cluster", "NodeConfig", "Worker", "WorkerHandle", "worker_argv"]
