"""The notification service: targets (webhooks, apprise URLs), the pending
deliveries the ingest records, and the background worker that sends them.

Nothing waits on a receiver: the ingest only adds rows (in its own transaction);
the worker sends at most :attr:`DeliveryPolicy.concurrency` deliveries at once,
each with a timeout, and leaves the rest in the store (the bounded queue: the
store holds what waits, so nothing is lost across a restart); a failure is tried
again after ``backoff * 2**(attempts-1)`` seconds (at most ``max_backoff``) until
``attempts`` tries were made, then the delivery is ``failed``. A delivery is sent
at least once: one in flight when the server stops is sent again after its start
(``X-Corral-Delivery`` lets a receiver drop a repeat). A job's notices reach each
target in the order they happened: one is sent once the earlier ones of the same job
to the same target are delivered or given up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
from sqlalchemy import delete, event, exists, func, select
from sqlalchemy.orm import Session, aliased

from corral.errors import Invalid, NotFound
from corral.job.events import JobEvent
from corral.notify import send, urls
from corral.notify.events import JobFacts, Notice, for_target, notices
from corral.notify.models import DeliveryOut, HookOut, NotifierIn, WebhookIn
from corral.notify.urls import AddressRefused, AddressRule, check_host, mask_url
from corral.store import Store
from corral.store.models import Delivery, Job, Preference, Webhook

log = logging.getLogger("corral.serve")

WEBHOOK = "webhook"
APPRISE = "apprise"
#: Finished deliveries kept per target (the oldest beyond are dropped).
KEEP_PER_HOOK = 1000
#: The preference row of the address rule (:class:`~corral.notify.urls.AddressRule`).
ADDRESS_RULE_KEY = "notify-addresses"


@dataclass(frozen=True)
class DeliveryPolicy:
    """How deliveries are sent and retried; ``public_url``: the server's address as
    its users reach it (the job page's link), None: a path only."""

    attempts: int = 10
    backoff: float = 5.0
    max_backoff: float = 600.0
    timeout: float = 10.0
    concurrency: int = 8
    public_url: str | None = None

    def delay(self, attempts: int) -> float:
        """Seconds before the next try after ``attempts`` failed ones."""
        return float(min(self.max_backoff, self.backoff * 2 ** max(0, attempts - 1)))

    def link(self, job_id: str) -> str:
        """The job page's URL."""
        return f"{(self.public_url or '').rstrip('/')}/jobs/{job_id}"


def _out(hook: Webhook, pending: int = 0) -> HookOut:
    url = mask_url(hook.url)
    if hook.kind == APPRISE:
        try:
            url = send.apprise_privacy_url(hook.url)
        except Exception:  # apprise gone since: show the scheme only, never the rest
            url = hook.url.partition("://")[0] + "://..."
    return HookOut(
        id=hook.id,
        kind=hook.kind,
        url=url,
        events=list(hook.events),
        created=hook.created,
        has_secret=bool(hook.secret),
        pending=pending,
    )


def _delivery_out(d: Delivery) -> DeliveryOut:
    return DeliveryOut(
        id=d.id,
        hook_id=d.hook_id,
        event=d.event,
        job_id=d.job_id,
        state=d.state,
        attempts=d.attempts,
        status_code=d.status_code,
        last_error=d.last_error,
        created=d.created,
        last_try=d.last_try,
        next_try=d.next_try if d.state == "pending" else None,
        payload=dict(d.payload),
    )


class Notifications:
    """Targets, deliveries and the worker over ``store``."""

    def __init__(self, store: Store, policy: DeliveryPolicy | None = None) -> None:
        self.store = store
        self.policy = policy or DeliveryPolicy()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._inflight: set[int] = set()

    # -- targets (the admin's routes) ------------------------------------------------------

    def add_webhook(self, body: WebhookIn) -> HookOut:
        """Register a webhook (Invalid when the address rule refuses its host)."""
        self._allowed(body.url)
        return self._add(WEBHOOK, body.url, body.secret, list(body.events))

    def add_notifier(self, body: NotifierIn) -> HookOut:
        """Register an apprise URL (Invalid without apprise or for a URL it cannot use)."""
        send.apprise_privacy_url(body.url)
        self._allowed(body.url)
        return self._add(APPRISE, body.url, None, list(body.events))

    def _allowed(self, url: str) -> None:
        try:
            check_host(url, self.address_rule())
        except AddressRefused as exc:
            raise Invalid(f"url: {exc}", details={"field": "url"}) from None

    def address_rule(self) -> AddressRule:
        """Which addresses notifications may go to (the default until an admin sets it)."""
        with self.store.session() as s:
            row = s.get(Preference, ADDRESS_RULE_KEY)
            value = dict(row.value) if row is not None else None
        return AddressRule.model_validate(value) if value is not None else AddressRule()

    def set_address_rule(self, rule: AddressRule) -> AddressRule:
        """Save the address rule (it holds for the next delivery of every target)."""
        value = {"allow": sorted(set(rule.allow))}
        with self.store.session() as s:
            s.merge(Preference(key=ADDRESS_RULE_KEY, value=value, updated=time.time()))
        return AddressRule.model_validate(value)

    def _add(self, kind: str, url: str, secret: str | None, events: list[str]) -> HookOut:
        hook = Webhook(
            id=_new_id("hook" if kind == WEBHOOK else "ntf"),
            kind=kind,
            url=url,
            secret=secret,
            events=list(dict.fromkeys(events)),
            created=time.time(),
        )
        with self.store.session() as s:
            s.add(hook)
            s.flush()
            return _out(hook)

    def targets(self, kind: str) -> list[HookOut]:
        """Every target of ``kind``, oldest first, with its pending count."""
        with self.store.session() as s:
            hooks = s.scalars(select(Webhook).where(Webhook.kind == kind).order_by(Webhook.created))
            counts = dict(
                s.execute(
                    select(Delivery.hook_id, func.count())
                    .where(Delivery.state == "pending")
                    .group_by(Delivery.hook_id)
                ).all()
            )
            return [_out(h, int(counts.get(h.id, 0))) for h in hooks]

    def _hook(self, s: Session, kind: str, hook_id: str) -> Webhook:
        hook = s.get(Webhook, hook_id)
        if hook is None or hook.kind != kind:
            noun = "webhook" if kind == WEBHOOK else "notifier"
            raise NotFound(f"no {noun} {hook_id!r}", details={"id": hook_id})
        return hook

    def delete(self, kind: str, hook_id: str) -> HookOut:
        """Remove a target and its delivery log; it as it was."""
        with self.store.session() as s:
            hook = self._hook(s, kind, hook_id)
            out = _out(hook)
            s.execute(delete(Delivery).where(Delivery.hook_id == hook_id))
            s.delete(hook)
            return out

    def deliveries(self, kind: str, hook_id: str, limit: int = 100) -> list[DeliveryOut]:
        """A target's delivery log, newest first."""
        with self.store.session() as s:
            self._hook(s, kind, hook_id)
            rows = s.scalars(
                select(Delivery)
                .where(Delivery.hook_id == hook_id)
                .order_by(Delivery.id.desc())
                .limit(limit)
            )
            return [_delivery_out(d) for d in rows]

    # -- recording (the ingest) -------------------------------------------------------------

    def record(self, s: Session, job: Job, ev: JobEvent) -> None:
        """Store a pending delivery of each notice ``ev`` is worth to each target that
        wants it, in the ingest's session ``s`` (the worker is woken once it commits)."""
        try:
            found = notices(ev, facts(job))
        except Exception:  # a bug here must not hold up the ingest of the job's events
            log.exception("job %s: the notices of a %s event failed", job.id, type(ev).__name__)
            return
        if not found:
            return
        hooks = list(s.scalars(select(Webhook)))
        now = time.time()
        added = False
        payloads = {id(n): self._payload(n, job) for n in found}
        for hook in hooks:
            for notice in for_target(found, hook.events):  # one terminal notice each
                s.add(
                    Delivery(
                        hook_id=hook.id,
                        event=notice.event,
                        job_id=job.id,
                        payload=payloads[id(notice)],
                        state="pending",
                        attempts=0,
                        created=now,
                        next_try=now,
                    )
                )
                added = True
        if added:
            event.listen(s, "after_commit", lambda _s: self.wake(), once=True)

    def _payload(self, notice: Notice, job: Job) -> dict[str, Any]:
        link = self.policy.link(job.id)
        return {
            "event": notice.event,
            "time": notice.time,
            "text": notice.text,
            "job": {
                "id": job.id,
                "name": job_name(job),
                "state": job.state,
                "owner": job.owner,
                "url": link,
            },
            "data": notice.data,
        }

    # -- the worker ---------------------------------------------------------------------------

    def wake(self) -> None:
        """Have the worker look for due deliveries now (safe from any thread)."""
        loop, waker = self._loop, self._wake
        if loop is not None and waker is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(waker.set)

    async def run(self, idle: float = 30.0) -> None:
        """Send due deliveries forever (the server's background task)."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()
        async with httpx.AsyncClient(follow_redirects=False, trust_env=False) as client:
            try:
                while True:
                    self._wake.clear()
                    try:
                        due, next_at = await asyncio.to_thread(self._claim)
                    except RuntimeError:
                        return  # the loop's executor is shut down: the server is exiting
                    except Exception:
                        log.exception("reading the pending notifications failed")
                        due, next_at = [], None
                    for delivery_id in due:
                        task = asyncio.create_task(self._deliver(client, delivery_id))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                        task.add_done_callback(lambda _t: self.wake())
                    wait = idle if next_at is None else max(0.0, next_at - time.time())
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), min(idle, wait))
            finally:
                for task in tasks:
                    task.cancel()
                for task in list(tasks):
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    def _claim(self) -> tuple[list[int], float | None]:
        """Up to the free slots of due pending deliveries (marked in flight), and when
        the next pending one not taken is due."""
        free = self.policy.concurrency - len(self._inflight)
        now = time.time()
        with self.store.session() as s:
            earlier = aliased(Delivery)
            # a job's notices reach a target in order: one waits while an earlier one of
            # the same job to the same target is pending (in flight or backing off)
            first = ~exists().where(
                earlier.hook_id == Delivery.hook_id,
                earlier.job_id == Delivery.job_id,
                earlier.state == "pending",
                earlier.id < Delivery.id,
            )
            pending = select(Delivery.id, Delivery.next_try).where(
                Delivery.state == "pending", first
            )
            if self._inflight:
                pending = pending.where(Delivery.id.not_in(self._inflight))
            rows = s.execute(pending.order_by(Delivery.next_try, Delivery.id).limit(free + 1))
            found = [(int(i), float(at)) for i, at in rows] if free > 0 else []
        due = [i for i, at in found[:free] if at <= now]
        later = [at for i, at in found if i not in due]
        self._inflight.update(due)
        return due, (min(later) if later else None)

    async def _deliver(self, client: httpx.AsyncClient, delivery_id: int) -> None:
        """One attempt: whatever goes wrong in it is that attempt's error (counted, and
        tried again after the backoff), never a hot loop of retries or a traceback."""
        try:
            target = await asyncio.to_thread(self._target, delivery_id)
            if target is None:
                return
            try:
                status, error = await self._send(client, delivery_id, target)
            except Exception as exc:  # a bug or a URL nothing can send to: this try failed
                status, error = None, send.failure(exc)
            await asyncio.to_thread(self._outcome, delivery_id, status, error)
        except Exception as exc:  # the store failed: hold this one back for a backoff
            log.warning("notification %d: recording the attempt failed: %s", delivery_id,
                        send.failure(exc))  # fmt: skip
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(self.policy.backoff)
        finally:
            self._inflight.discard(delivery_id)

    async def _send(
        self, client: httpx.AsyncClient, delivery_id: int, target: _Target
    ) -> tuple[int | None, str | None]:
        if target.kind == WEBHOOK:
            try:
                pinned_to = await urls.pinned(target.url, target.rule)
            except AddressRefused as exc:
                return None, str(exc)
            body = send.body_of({**target.payload, "delivery": delivery_id})
            headers = send.webhook_headers(target.secret, body, target.event, delivery_id)
            return await send.post_webhook(client, pinned_to, headers, body, self.policy.timeout)
        if urlsplit(target.url).scheme.lower() in urls.APPRISE_HOST_SCHEMES:
            try:
                await urls.resolved(target.url, target.rule)
            except AddressRefused as exc:
                return None, str(exc)
        payload = target.payload
        text = f"{payload.get('text', '')} {payload.get('job', {}).get('url', '')}"
        error = await asyncio.to_thread(
            send.send_apprise, target.url, f"corral: {target.event}", text.strip()
        )
        return None, error

    def _target(self, delivery_id: int) -> _Target | None:
        rule = self.address_rule()
        with self.store.session() as s:
            d = s.get(Delivery, delivery_id)
            if d is None or d.state != "pending":
                return None
            hook = s.get(Webhook, d.hook_id)
            if hook is None:
                return None
            return _Target(hook.kind, hook.url, hook.secret, d.event, dict(d.payload), rule)

    def _outcome(self, delivery_id: int, status: int | None, error: str | None) -> None:
        now = time.time()
        with self.store.session() as s:
            d = s.get(Delivery, delivery_id)
            if d is None:
                return  # its target was removed meanwhile
            d.attempts += 1
            d.last_try = now
            d.status_code = status
            d.last_error = error
            if error is None:
                d.state = "delivered"
            elif d.attempts >= self.policy.attempts:
                d.state = "failed"
                log.warning(
                    "notification %d (%s of job %s) to target %s: attempt %d failed, given "
                    "up: %s", d.id, d.event, d.job_id, d.hook_id, d.attempts, error,
                )  # fmt: skip
            else:
                delay = self.policy.delay(d.attempts)
                d.next_try = now + delay
                log.info(
                    "notification %d (%s of job %s) to target %s: attempt %d of %d failed, "
                    "next in %.0f s: %s", d.id, d.event, d.job_id, d.hook_id, d.attempts,
                    self.policy.attempts, delay, error,
                )  # fmt: skip
            if d.state != "pending":
                _prune(s, d.hook_id)


@dataclass(frozen=True)
class _Target:
    """What one attempt sends, and where."""

    kind: str
    url: str
    secret: str | None
    event: str
    payload: dict[str, Any]
    rule: AddressRule


def _prune(s: Session, hook_id: str) -> None:
    """Keep the newest :data:`KEEP_PER_HOOK` finished deliveries of a target."""
    cutoff = s.scalar(
        select(Delivery.id)
        .where(Delivery.hook_id == hook_id, Delivery.state != "pending")
        .order_by(Delivery.id.desc())
        .offset(KEEP_PER_HOOK)
        .limit(1)
    )
    if cutoff is not None:
        s.execute(
            delete(Delivery).where(
                Delivery.hook_id == hook_id, Delivery.state != "pending", Delivery.id <= cutoff
            )
        )


def facts(job: Job) -> JobFacts:
    """What :func:`~corral.notify.events.notices` needs of a job row."""
    return JobFacts(
        id=job.id,
        state=job.state,
        name=job_name(job),
        owner=job.owner,
        queued=job.queued,
        reason=job.reason or "",
        exit_code=job.exit_code,
        root_cause=dict(job.root_cause) if job.root_cause else None,
    )


def job_name(job: Job) -> str | None:
    """The job's ``--name`` (None when it was given none)."""
    name = (job.request or {}).get("name")
    return str(name) if name else None


def _new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(5)}"
