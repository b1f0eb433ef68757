"""What the server tells about its jobs: status, lists and pages, output, files and
the live event stream (read from the store and the jobs' run dirs)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import delete, func, select

from corral.errors import Conflict, Forbidden, Invalid, NotFound
from corral.job.describe import JobDescription
from corral.job.events import (
    FINAL_KINDS,
    HangReported,
    JobEvent,
    StragglerFound,
    decode_event,
    fields_of,
)
from corral.job.fold import TeardownFold
from corral.job.states import ACTIVE_STATES, TERMINAL_STATES, JobState, state_values
from corral.job.summary import preflight_findings, reason_text
from corral.service.chain import after_of
from corral.service.eventlog import EVENTS_FILE, LoggedEvent, read_events
from corral.service.fanout import Feeds
from corral.service.ingest import Ingest, Live, in_place, machine_ids, rank_number
from corral.service.jobrows import job_row
from corral.service.models import (
    DistributedJobStatus,
    JobList,
    JobSummary,
    OutputPage,
    WorkloadWeight,
)
from corral.service.statusparts import GroupChange, HangOut, NodeStatus, StragglerOut
from corral.store import Store
from corral.store.models import Attempt, Event, Job, Machine, Node, Rank, Task

FILE_ALIASES = {
    "result": "result.json",
    "plan": "plan.json",
    "job": "job.json",
    "attempts": "attempts.json",
    "events": EVENTS_FILE,
    "supervisor_log": "supervisor.log",
}


class Queries:
    """Reading jobs: every view catches up with the events written so far."""

    def __init__(
        self, store: Store, ingest: Ingest, live: Live, launches: dict[str, JobDescription]
    ) -> None:
        self.store = store
        self.ingest = ingest
        self.live = live
        self.launches = launches
        self.feeds = Feeds(self._source, live)
        #: why a queued job waits, as the queue says it (set by the queue's owner)
        self.queued_reason: Callable[[Job], str] | None = None

    def row(self, job_id: str) -> Job:
        """The job's row (NotFound when unknown)."""
        return job_row(self.store, job_id)

    def status(self, job_id: str) -> DistributedJobStatus:
        """The seed's DistributedJobStatus of a job."""
        self.ingest.catch_up(job_id)
        with self.store.session() as s:
            job = s.get(Job, job_id)
            if job is None:
                raise NotFound(f"no job {job_id!r}", details={"job_id": job_id})
            nodes = list(
                s.scalars(select(Node).where(Node.job_id == job_id).order_by(Node.node_rank)).all()
            )
            ranks = list(
                s.scalars(select(Rank).where(Rank.job_id == job_id).order_by(Rank.rank)).all()
            )
            attempts = list(
                s.scalars(
                    select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number)
                ).all()
            )
            task = s.get(Task, job.task_id) if job.task_id else None
            checked = s.scalars(
                select(Event)
                .where(Event.job_id == job_id, Event.kind == "checked")
                .order_by(Event.pos.desc())
                .limit(1)
            ).first()
            groups = list(
                s.scalars(
                    select(Event)
                    .where(Event.job_id == job_id, Event.kind == "group")
                    .order_by(Event.pos)
                ).all()
            )
            diagnosed = list(
                s.scalars(
                    select(Event)
                    .where(Event.job_id == job_id, Event.kind == "straggler")
                    .order_by(Event.pos)
                ).all()
            )
            hang = s.scalars(  # only the last report counts
                select(Event)
                .where(Event.job_id == job_id, Event.kind == "hang_report")
                .order_by(Event.pos.desc())
                .limit(1)
            ).first()
            if hang is not None:
                diagnosed.append(hang)
        status = _status(job, nodes, ranks, attempts, task.name if task else None)
        if job.state == JobState.QUEUED and self.queued_reason is not None:
            status.reason = self.queued_reason(job)  # as the queue says it, now
        if checked is not None:
            status.preflight = preflight_findings((checked.data or {}).get("report"))
        status.groups = [GroupChange.model_validate({**g.data, "time": g.time}) for g in groups]
        status.stragglers, status.hang = _diagnosis(job_id, diagnosed)
        return status

    def list_jobs(
        self,
        *,
        state: str | None = None,
        machine: str | None = None,
        task_id: str | None = None,
        kind: str | None = None,
        owner: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> JobList:
        """Jobs, newest first, filtered by state (comma-separated), machine (id or
        name), task, kind or owner."""
        filters = []
        if owner:
            filters.append(Job.owner == owner)
        if state:
            filters.append(Job.state.in_([x.strip() for x in state.split(",")]))
        if task_id:
            filters.append(Job.task_id == task_id)
        if kind:
            filters.append(Job.kind == kind)
        query = select(Job).where(*filters).order_by(Job.created.desc())
        if not machine:  # page in SQL: never load (and JSON-decode) every job's row
            with self.store.session() as s:
                # counted over the id alone: a subquery of whole rows reads every
                # job's JSON columns (115 ms at 10,000 jobs on SQLite)
                total = s.scalar(select(func.count(Job.id)).where(*filters))
                page = list(s.scalars(query.offset(offset).limit(limit)).all())
                tasks = _task_names(s, page)
            return JobList(
                jobs=[_summary(r, tasks) for r in page],
                total=int(total or 0),
                limit=limit,
                offset=offset,
            )
        with self.store.session() as s:
            rows = list(s.scalars(query).all())
            names = {m.id: m.name for m in s.scalars(select(Machine))}
            tasks = _task_names(s, rows)
        rows = [
            r
            for r in rows
            if machine in (r.machine_ids or [])
            or machine in [names.get(i) for i in (r.machine_ids or [])]
            or machine in [m.get("name") for m in (r.plan or {}).get("machines", [])]
        ]
        page = rows[offset : offset + limit]
        return JobList(
            jobs=[_summary(r, tasks) for r in page], total=len(rows), limit=limit, offset=offset
        )

    def output(self, job_id: str, offset: int = 0, limit: int = 1000) -> OutputPage:
        """Merged ``[host:rank]`` output from byte ``offset`` of the events file, the
        launcher's teardown noise folded (:class:`~corral.job.fold.TeardownFold`)."""
        row = self.row(job_id)
        if offset < 0:
            raise Invalid("offset must be >= 0", details={"field": "offset"})
        self.ingest.catch_up(job_id)
        lines: list[str] = []
        pos = offset
        path = events_path(row)
        fold = self._fold_before(job_id, offset)
        for ev in read_events(path, offset) if path is not None else ():
            pos = ev.next_pos
            if fold.see(_decoded(ev, job_id)):
                continue
            if fold.ended:
                lines.extend(f"[corral] {note}" for note in fold.flush())
            if ev.data.get("kind") == "log":
                lines.extend(prefixed_lines(ev.data))
            elif ev.data.get("kind") == "message":
                lines.append(f"[corral] {ev.data.get('text', '')}")
            if len(lines) >= limit:
                break
        size = path.stat().st_size if path is not None and path.exists() else 0
        return OutputPage(
            job_id=job_id,
            offset=offset,
            next_offset=pos,
            lines=lines,
            finished=row.state in TERMINAL_STATES and pos >= size,
        )

    def file(self, job_id: str, key: str) -> Path:
        """A file of the job's run dir by alias (result, plan, job, attempts, events,
        supervisor_log) or relative path (``logs/HOST.RANK.log``); Forbidden outside."""
        base = run_dir_of(self.row(job_id))
        if base is None:  # queued: no run dir yet (never the server's cwd, its data dir)
            raise NotFound(f"job {job_id} has no file {key!r}", details={"key": key, "files": []})
        name = FILE_ALIASES.get(key, key)
        target = (base / name).resolve()
        if not target.is_relative_to(base) or target == base:
            raise Forbidden(f"{key!r} is outside job {job_id}'s run dir", details={"key": key})
        try:
            found = target.is_file()
        except OSError:  # a name too long, ...: no such file
            found = False
        if not found:
            raise NotFound(
                f"job {job_id} has no file {key!r}",
                details={"key": key, "files": self.files(job_id)},
            )
        return target

    def files(self, job_id: str) -> list[str]:
        """The job's files (relative paths; logs included)."""
        base = run_dir_of(self.row(job_id))
        if base is None or not base.is_dir():
            return []
        return sorted(
            str(p.relative_to(base))
            for p in base.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        )

    async def events(self, job_id: str, start: int = 0) -> AsyncIterator[LoggedEvent]:
        """Every event of the job from byte ``start`` on, live, until it has ended
        (each event's ``next_pos`` is where a reconnect resumes). The launcher's
        teardown noise is folded into one ``message`` per node (its ``next_pos`` is
        the event that ended the teardown). A queued job's run dir is read once it
        has one (it gets it when it starts)."""
        self.row(job_id)
        fold = self._fold_before(job_id, start)
        # one shared reader of the file per job (corral.service.fanout), not one per stream
        async with contextlib.aclosing(self.feeds.follow(job_id, start)) as events:
            async for ev in events:
                if fold.see(_decoded(ev, job_id)):
                    continue
                if fold.ended:
                    for note in fold.flush():
                        data = {"kind": "message", "time": ev.data.get("time"), "text": note}
                        yield LoggedEvent(ev.pos, ev.pos, {**data, "level": "detail"})
                if ev.data.get("kind") in FINAL_KINDS:  # the status agrees once it is seen
                    await asyncio.to_thread(self.ingest.catch_up, job_id)
                    yield ev
                    return
                yield ev

    def _source(self, job_id: str) -> tuple[Path | None, bool]:
        """The job's events file (None while queued) and whether it has ended."""
        row = self.row(job_id)
        return events_path(row), row.state in TERMINAL_STATES

    def _fold_before(self, job_id: str, pos: int) -> TeardownFold:
        """The teardown fold as it stood at byte ``pos`` of the job's events (from the
        stored events: a page or a reconnect goes on folding where the last one was)."""
        fold = TeardownFold()
        if pos <= 0:
            return fold
        kinds = ("state", "rank_exit", "attempt_started")
        with self.store.session() as s:
            rows = s.scalars(
                select(Event)
                .where(Event.job_id == job_id, Event.pos < pos, Event.kind.in_(kinds))
                .order_by(Event.pos)
            ).all()
            stored = [{**r.data, "kind": r.kind, "time": r.time} for r in rows]
        for data in stored:
            event = decode_event(data, job_id)
            if event is not None:
                fold.see(event)
        fold.flush()
        return fold

    def delete(self, job_id: str) -> JobSummary:
        """Forget a job that is not active (planned, queued or finished): its rows go,
        its run dir stays. Conflict while it runs."""
        row = self.row(job_id)
        if row.state in ACTIVE_STATES:
            raise Conflict(
                f"job {job_id} is {row.state}: stop it before deleting it",
                details={"job_id": job_id, "status": row.state},
            )
        with self.store.session() as s:
            done = Job.state.not_in(state_values(ACTIVE_STATES))
            s.execute(delete(Job).where(Job.id == job_id, done))
        self.launches.pop(job_id, None)
        return _summary(row)


def events_path(row: Job) -> Path | None:
    """The job's events file; None while it has no run dir (a queued job)."""
    return Path(row.run_dir) / EVENTS_FILE if row.run_dir else None


def run_dir_of(row: Job) -> Path | None:
    """The job's run dir, resolved; None while it has none (a queued job: its empty
    ``run_dir`` is no path, and ``Path("")`` would be the server's working dir)."""
    return Path(row.run_dir).resolve() if row.run_dir else None


_FOLDED = frozenset({"log", "state", "rank_exit", "attempt_started"})
"""The kinds the teardown fold reads: only those are decoded (the one decoder)."""


def _decoded(ev: LoggedEvent, job_id: str) -> JobEvent | None:
    """The typed event the fold needs (log lines, states, rank exits, attempts)."""
    return decode_event(ev.data, job_id) if ev.data.get("kind") in _FOLDED else None


def prefixed_lines(data: dict[str, Any]) -> list[str]:
    """A log event's lines, each prefixed ``[host:rank]`` (``[host]`` for the node's own).

    A line a progress bar rewrote with ``\r`` shows its last state, and a chunk that
    ends in ``\r`` (an update without a newline yet) counts as a line."""
    rank = data.get("rank", -1)
    host = data.get("host")
    prefix = f"[{host}:{rank}]" if rank is not None and rank >= 0 else f"[{host}]"
    text = str(data.get("text", "")).replace("\r\n", "\n")
    pieces = text.split("\n")
    if pieces and pieces[-1] == "":
        pieces.pop()  # the newline that ended the last line
    out = []
    for piece in pieces:
        shown = next((seg for seg in reversed(piece.split("\r")) if seg), "")
        if shown or not piece:
            out.append(f"{prefix} {shown}")
    return out


def _task_names(s: Any, rows: Sequence[Job]) -> dict[str, str]:
    """Task id -> name of the tasks the jobs were made from."""
    ids = {r.task_id for r in rows if r.task_id}
    if not ids:
        return {}
    return {t.id: t.name for t in s.scalars(select(Task).where(Task.id.in_(ids)))}


def display_name(job: Job, task_name: str | None = None) -> str | None:
    """The name every view shows for a job: its own, else its task's, else its
    script's (file name), plugin's or command template's."""
    request = job.request or {}
    if request.get("name"):
        return str(request["name"])
    if task_name:
        return task_name
    if request.get("script"):
        return Path(str(request["script"])).name
    shown = request.get("plugin_name") or request.get("command_template")
    return str(shown) if shown else None


def _summary(r: Job, tasks: dict[str, str] | None = None) -> JobSummary:
    names = [m.get("name") for m in (r.plan or {}).get("machines", [])]
    end = r.ended or (time.time() if r.started and r.state in ACTIVE_STATES else None)
    return JobSummary(
        job_id=r.id,
        name=display_name(r, (tasks or {}).get(r.task_id or "")),
        script=(r.request or {}).get("script")
        or (r.request or {}).get("plugin_name")
        or (r.request or {}).get("command_template"),
        kind=r.kind,
        status=r.state,
        created=r.created,
        started=r.started,
        ended=r.ended,
        duration=(end - r.started) if end and r.started else None,
        exit_code=r.exit_code,
        machines=[str(n) for n in names],
        world_size=r.world_size,
        task_id=r.task_id,
        owner=r.owner,
        priority=r.priority or 0,
    )


def _status(
    job: Job,
    nodes: Sequence[Node],
    ranks: Sequence[Rank],
    attempts: Sequence[Attempt],
    task_name: str | None = None,
) -> DistributedJobStatus:
    by_host: dict[str, list[Rank]] = {}
    for r in ranks:
        by_host.setdefault(r.host, []).append(r)
    running = job.state in ACTIVE_STATES
    # the master is where rank 0 ran (torchrun's rendezvous may put it on any node), and
    # a node's rank is torchrun's GROUP_RANK: nodes in the order of their lowest rank
    # (in place, every replica group has its own rank 0: the nodes keep their order)
    rank0 = next((r.host for r in ranks if r.rank == 0), None)
    lowest = {host: min(r.rank for r in rows) for host, rows in by_host.items()}
    order = {h: i for i, h in enumerate(sorted(lowest, key=lambda h: lowest[h]))}
    if len(order) != len(nodes) or in_place(job):
        order = {}
    plan_nodes = (job.plan or {}).get("nodes", [])
    machine_by_name = machine_ids(job)
    out: list[NodeStatus] = []
    if nodes:
        for n in nodes:
            out.append(
                _node_status(
                    n.host,
                    n.machine_id,
                    order.get(n.host, n.node_rank),
                    n.state,
                    n.detail,
                    n.started,
                    n.ended,
                    by_host.get(n.host, []),
                    running=running,
                )
            )
    else:
        for p in plan_nodes:
            out.append(
                _node_status(
                    p["host"],
                    machine_by_name.get(p["host"]),
                    p["node_rank"],
                    job.state,
                    "",
                    None,
                    None,
                    by_host.get(p["host"], []),
                    planned=p.get("ranks") or [],
                    running=running,
                )
            )
    out.sort(key=lambda n: n.node_rank)
    return DistributedJobStatus(
        job_id=job.id,
        name=display_name(job, task_name),
        kind=job.kind,
        status=job.state,
        reason=reason_text(job.reason or "", (job.root_cause or {}).get("message")),
        world_size=job.world_size,
        master=rank0 or job.master,
        created=job.created,
        started=job.started,
        ended=job.ended,
        exit_code=job.exit_code,
        attempt=job.attempt,
        restarts=job.restarts,
        nodes=out,
        attempts=[
            {
                "number": a.number,
                "started": a.started,
                "ended": a.ended,
                "hosts": a.hosts,
                "world_size": a.world_size,
                "checkpoint": a.checkpoint,
                "restart": a.restart,
                "decision": a.decision,
                "cause": (a.record or {}).get("cause") or (a.record or {}).get("reason"),
                "record": a.record,
            }
            for a in attempts
        ],
        last_metrics=dict(job.last_metrics or {}),
        root_cause=job.root_cause,
        machines=[m["name"] for m in (job.plan or {}).get("machines", [])],
        task_id=job.task_id,
        workload_weights=_current_weights(job, attempts),
        owner=job.owner,
        priority=job.priority or 0,
        after=after_of(job.request),
    )


def _diagnosis(job_id: str, rows: Sequence[Event]) -> tuple[list[StragglerOut], HangOut | None]:
    """The stragglers named (the latest per rank and section, in the order first named)
    and the last hang report, from the stored events (decoded as the supervisor wrote
    them; one a newer writer made that this version cannot read is left out)."""
    stragglers: dict[tuple[str, int, str], StragglerOut] = {}
    hang: HangOut | None = None
    for row in rows:
        event = decode_event({**row.data, "kind": row.kind, "time": row.time}, job_id)
        if isinstance(event, StragglerFound):
            key = (event.host, event.rank, event.section)
            stragglers[key] = StragglerOut.model_validate(fields_of(event))
        elif isinstance(event, HangReported):
            hang = HangOut.model_validate(fields_of(event))
    return list(stragglers.values()), hang


def _current_weights(job: Job, attempts: Sequence[Attempt]) -> list[WorkloadWeight] | None:
    """Each rank's share in the latest attempt that recorded weights (``--rebalance``
    re-weighs at a restart; a restart without a lost host re-splits), else in the plan;
    None for an even split. An attempt's ranks are its hosts' planned ranks, in order."""
    planned = [
        WorkloadWeight.model_validate(w) for w in (job.plan or {}).get("workload_weights") or []
    ]
    per_host = Counter(row.host for row in planned)
    fits = {(row.host, row.local_rank): row.fits for row in planned}
    for attempt in sorted(attempts, key=lambda a: a.number, reverse=True):
        weights = attempt.workload_weights or []
        slots = [(str(h), per_host.get(str(h), 0)) for h in attempt.hosts or []]
        if not weights or sum(n for _, n in slots) != len(weights):
            continue
        places = [(h, node, local) for node, (h, n) in enumerate(slots) for local in range(n)]
        return [
            WorkloadWeight(
                host=h, node_rank=node, local_rank=local, weight=float(w), fits=fits.get((h, local))
            )
            for (h, node, local), w in zip(places, weights, strict=True)
        ]
    return planned or None


def _node_status(
    host: str,
    machine_id: str | None,
    node_rank: int,
    state: str,
    detail: str,
    started: float | None,
    ended: float | None,
    ranks: Sequence[Rank],
    planned: Sequence[int] = (),
    *,
    running: bool = True,
) -> NodeStatus:
    steps = [r.step for r in ranks if r.step is not None]
    rates = [r.steps_per_s for r in ranks if r.steps_per_s]
    totals = [r.total for r in ranks if r.total]
    step = min(steps) if steps else None
    total = max(totals) if totals else None
    rate = min(rates) if rates else None
    # no ETA once the job has ended (a failed job never reaches its last step)
    eta = (total - step) / rate if running and step is not None and total and rate else None
    first = min(ranks, key=lambda r: r.rank) if ranks else None
    progress = {
        "step": step,
        "total": total,
        "steps_per_s": rate,
        "eta_s": round(eta, 1) if eta is not None else None,
        "percent": round(100.0 * step / total, 1) if step is not None and total else None,
        "metrics": dict(first.metrics or {}) if first else {},
        "ranks": {
            str(rank_number(r.rank)): {
                "step": r.step,
                "total": r.total,
                "steps_per_s": r.steps_per_s,
                "code": r.code,
                "metrics": r.metrics,
            }
            for r in ranks
        },
    }
    return NodeStatus(
        host=host,
        machine_id=machine_id,
        node_rank=node_rank,
        ranks=sorted({rank_number(r.rank) for r in ranks} | set(planned)),
        status=state,
        detail=detail,
        start_time=started,
        end_time=ended,
        progress=progress,
    )
