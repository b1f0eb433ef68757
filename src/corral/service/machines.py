"""Registered machines: add, list, remove, ping and health-check them.

A machine is ``busy`` while a job that uses it is active (its supervisor is
preparing, running, stopping or restarting it); otherwise its status is what the
last ping or health check saw: ``online``, ``offline`` or ``unknown`` (never
checked). A ``local`` machine is a simulated node on the server's own machine
(the CLI's ``local:N``): it is online whenever the server is.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from corral.cluster.model import Cluster, Host
from corral.errors import Conflict, CorralError, Invalid, NotFound
from corral.fleet.capabilities import MachineHealth, local_health, probe_machines
from corral.job.states import ACTIVE_STATES as JOB_ACTIVE_STATES
from corral.job.states import state_values
from corral.service.models import MachineIn, MachineOut, NetworkStatus
from corral.service.settings import ServerSettings, new_id
from corral.store import Store
from corral.store.models import Job, Machine
from corral.transport.choose import transport_for
from corral.transport.options import SshOptions

ACTIVE_STATES = tuple(state_values(JOB_ACTIVE_STATES))
"""Job states in which a job holds its machines (:data:`corral.job.states.ACTIVE_STATES`)."""


def busy_machines(store: Store) -> dict[str, list[str]]:
    """Machine id -> ids of the active jobs using it."""
    busy: dict[str, list[str]] = {}
    with store.session() as s:
        for job_id, ids in s.execute(
            select(Job.id, Job.machine_ids).where(Job.state.in_(ACTIVE_STATES))
        ):
            for mid in ids or ():
                busy.setdefault(str(mid), []).append(job_id)
    return busy


def machine_out(m: Machine, busy: dict[str, list[str]]) -> MachineOut:
    """The API view of a machine (no secret: a key path, a variable's name)."""
    jobs = busy.get(m.id, [])
    status = "busy" if jobs and m.status != "offline" else m.status
    return MachineOut(
        id=m.id,
        name=m.name,
        host=m.address,
        port=m.port,
        user=m.user,
        key_path=m.key_path,
        password_env=m.password_env,
        slots=m.slots,
        labels=dict(m.labels or {}),
        local=m.local,
        python=m.python,
        created=m.created,
        status=status,
        last_seen=m.last_seen,
        last_checked=m.last_checked,
        last_error=m.last_error,
        latency_ms=m.latency_ms,
        capabilities=dict(m.capabilities or {}),
        load=dict(m.load or {}),
        running_jobs=jobs,
    )


def machine_host(m: Machine) -> Host:
    """The machine as a node of a job."""
    return Host(
        name=m.name,
        address="" if m.local else m.address,
        port=m.port,
        user=m.user,
        slots=m.slots,
        local=m.local,
        python=m.python,
        labels={str(k): str(v) for k, v in (m.labels or {}).items()},
    )


def machines_ssh(machines: Sequence[Machine], settings: ServerSettings) -> SshOptions:
    """How a job reaches ``machines``: one key / password variable for all of them
    (Conflict when they differ: one job connects one way)."""
    keys = {m.key_path for m in machines if not m.local}
    passwords = {m.password_env for m in machines if not m.local}
    if len(keys) > 1 or len(passwords) > 1:
        names = ", ".join(m.name for m in machines)
        raise Conflict(
            f"machines {names} use different SSH keys or password variables; "
            "one job reaches all its machines the same way",
            details={
                "key_paths": sorted(k or "" for k in keys),
                "password_envs": sorted(p or "" for p in passwords),
            },
        )
    return SshOptions(
        key=next(iter(keys), None),
        password_env=next(iter(passwords), None),
        config=settings.ssh_config,
        accept_new_host_keys=settings.accept_new_host_keys,
        insecure_no_host_key_check=settings.insecure_no_host_key_check,
    )


class MachineService:
    """The machine registry over the store, and its health checks."""

    def __init__(
        self,
        store: Store,
        settings: ServerSettings,
        local_probe: Callable[[str], MachineHealth] = local_health,
    ) -> None:
        self.store = store
        self.settings = settings
        #: How a ``local`` machine is read (its capabilities and load; tests inject
        #: the load samples here, since the suggestions' score includes live CPU %).
        self.local_probe = local_probe

    # -- registry ----------------------------------------------------------------------

    def add(self, body: MachineIn) -> MachineOut:
        """Register a machine (Conflict when the name is taken). A local machine is
        checked at once (it is this machine)."""
        if body.local and (
            body.host or body.port or body.user or body.key_path or body.password_env
        ):
            raise Invalid(
                "a local machine is a simulated node on the server: host, port, user, "
                "key_path and password_env do not apply",
                details={"field": "local"},
            )
        machine = Machine(
            id=new_id("m"),
            name=body.name,
            address=body.host or ("127.0.0.1" if body.local else body.name),
            port=body.port,
            user=body.user,
            key_path=body.key_path,
            password_env=body.password_env,
            slots=body.slots,
            labels=dict(body.labels),
            local=body.local,
            python=body.python,
            created=time.time(),
            status="unknown",
            capabilities={},
            load={},
        )
        if body.local:
            _apply(machine, self.local_probe(body.name))
        try:
            with self.store.session() as s:
                s.add(machine)
        except IntegrityError as exc:
            raise Conflict(
                f"a machine named {body.name!r} is already registered",
                details={"name": body.name},
            ) from exc
        return machine_out(machine, {})

    def list_all(self) -> list[MachineOut]:
        """Every machine, by name."""
        busy = busy_machines(self.store)
        with self.store.session() as s:
            rows = s.scalars(select(Machine).order_by(Machine.name)).all()
        return [machine_out(m, busy) for m in rows]

    def get(self, machine_id: str) -> MachineOut:
        """One machine (NotFound when unknown)."""
        return machine_out(self.row(machine_id), busy_machines(self.store))

    def row(self, ref: str) -> Machine:
        """The machine with id (or, failing that, name) ``ref``."""
        with self.store.session() as s:
            m = s.get(Machine, ref) or s.scalars(select(Machine).where(Machine.name == ref)).first()
        if m is None:
            raise NotFound(f"no machine {ref!r}", details={"machine": ref})
        return m

    def rows(self, refs: Iterable[str]) -> list[Machine]:
        """The machines named by ids or names, in that order."""
        return [self.row(r) for r in refs]

    def delete(self, machine_id: str) -> MachineOut:
        """Remove a machine (Conflict while a job uses it)."""
        m = self.row(machine_id)
        busy = busy_machines(self.store)
        if busy.get(m.id):
            raise Conflict(
                f"machine {m.name} runs job(s) {', '.join(busy[m.id])}: stop them first",
                details={"jobs": busy[m.id]},
            )
        with self.store.session() as s:
            row = s.get(Machine, m.id)
            if row is not None:
                s.delete(row)
        return machine_out(m, {})

    def delete_by_name(self, name: str) -> MachineOut:
        """Remove the machine called ``name``."""
        with self.store.session() as s:
            m = s.scalars(select(Machine).where(Machine.name == name)).first()
        if m is None:
            raise NotFound(f"no machine named {name!r}", details={"name": name})
        return self.delete(m.id)

    def status(self) -> NetworkStatus:
        """Counts by status and every machine."""
        machines = self.list_all()
        count = {
            k: sum(1 for m in machines if m.status == k)
            for k in ("online", "offline", "busy", "unknown")
        }
        return NetworkStatus(total=len(machines), machines=machines, **count)

    # -- health ------------------------------------------------------------------------

    async def ping(self, machine_id: str) -> MachineOut:
        """Check one machine now (connect, capabilities, load) and record it."""
        m = self.row(machine_id)
        await self._probe([m], self.settings.ping_deadline)
        return self.get(m.id)

    async def health_check(self, deadline: float | None = None) -> NetworkStatus:
        """Check every machine in parallel, within ``deadline`` seconds, and record it."""
        with self.store.session() as s:
            machines = list(s.scalars(select(Machine)).all())
        await self._probe(machines, deadline or self.settings.health_deadline)
        return self.status()

    async def run_health_checks(self) -> None:
        """Check every machine every ``health_interval`` seconds (the server's
        background task: status, load and last-seen stay current without a click)."""
        log = logging.getLogger("corral.serve")
        while self.settings.health_interval > 0:
            await asyncio.sleep(self.settings.health_interval)
            try:
                await self.health_check()
            except RuntimeError:
                return  # the loop's executor is shut down: the server is exiting
            except Exception:
                log.exception("background health check failed")  # the next round retries

    async def _probe(self, machines: Sequence[Machine], deadline: float) -> None:
        groups: dict[tuple[str | None, str | None, bool], list[Machine]] = {}
        for m in machines:
            groups.setdefault((m.key_path, m.password_env, m.local), []).append(m)
        found: dict[str, MachineHealth] = {}
        results = await asyncio.gather(
            *(self._probe_group(group, deadline) for group in groups.values())
        )
        for result in results:
            found.update(result)
        with self.store.session() as s:
            for m in machines:
                row = s.get(Machine, m.id)
                if row is not None and m.name in found:
                    _apply(row, found[m.name])

    async def _probe_group(
        self, machines: Sequence[Machine], deadline: float
    ) -> dict[str, MachineHealth]:
        if machines[0].local:
            found = await asyncio.gather(
                *(asyncio.to_thread(self.local_probe, m.name) for m in machines)
            )
            return {h.name: h for h in found}
        hosts = [machine_host(m) for m in machines]
        try:
            ssh = machines_ssh(machines, self.settings)
            ssh.password()  # an unset password variable: these machines are offline
            transport = transport_for(Cluster(tuple(hosts)), ssh, connect_timeout=deadline)
        except CorralError as exc:
            now = time.time()
            return {
                m.name: MachineHealth(m.name, False, now, None, {}, {}, str(exc)) for m in machines
            }
        try:
            return await probe_machines(transport, hosts, deadline=deadline)
        finally:
            await transport.close()


def _apply(m: Machine, health: MachineHealth) -> None:
    """Record a probe's outcome on the machine's row."""
    m.last_checked = health.checked
    if health.online:
        m.status = "online"
        m.last_seen = health.checked
        m.last_error = None
        m.latency_ms = health.latency_ms
        m.capabilities = dict(health.capabilities)
        m.load = dict(health.load)
    else:
        m.status = "offline"
        m.last_error = health.error


__all__ = ["ACTIVE_STATES", "MachineService", "busy_machines", "machine_host", "machines_ssh"]
