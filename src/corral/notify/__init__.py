"""Notifications: a job's events pushed to webhooks and to chat and mail (apprise).

The server learns of a job's events in one place, the ingest of its events file
(:mod:`corral.service.ingest`); there :meth:`Notifications.record` turns each
typed event into the notices it means (:mod:`corral.notify.events`: started,
finished, failed, hang, host lost, restarted, healed, queued job started) and
stores one pending :class:`~corral.store.models.Delivery` per interested target,
in the same transaction as the event, so nothing is lost across a restart. A
background worker (:meth:`Notifications.run`) sends them: a webhook gets the
notice as JSON signed with its shared secret (:mod:`corral.notify.sign`), an
apprise URL one line with the job page's link (:mod:`corral.notify.send`);
a failure is retried with exponential backoff up to a bounded number of attempts,
and each attempt lands in the target's delivery log. The ingest never waits for a
receiver.
"""

from corral.notify.events import EVENTS, JobFacts, Notice, notices
from corral.notify.service import DeliveryPolicy, Notifications
from corral.notify.sign import SIGNATURE_HEADER, sign, verify

__all__ = [
    "EVENTS",
    "SIGNATURE_HEADER",
    "DeliveryPolicy",
    "JobFacts",
    "Notice",
    "Notifications",
    "notices",
    "sign",
    "verify",
]
