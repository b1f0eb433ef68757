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
any failure of an attempt (whatever raised it) is retried with exponential backoff up
to a bounded number of attempts, and each attempt lands in the target's delivery log
and in one log line. The ingest never waits for a receiver.

Webhook URLs are checked when added and shown with their credentials masked
(:func:`mask_url`, for every place that shows one: the API, the pages, the audit
log); the addresses they may reach are the admin's :class:`AddressRule`, checked again
at each delivery against the host's addresses then (:mod:`corral.notify.urls`).
"""

from corral.notify.events import EVENTS, JobFacts, Notice, notices
from corral.notify.service import DeliveryPolicy, Notifications
from corral.notify.sign import SIGNATURE_HEADER, sign, verify
from corral.notify.urls import AddressRule, check_url, mask_url

__all__ = [
    "EVENTS",
    "SIGNATURE_HEADER",
    "AddressRule",
    "DeliveryPolicy",
    "JobFacts",
    "Notice",
    "Notifications",
    "check_url",
    "mask_url",
    "notices",
    "sign",
    "verify",
]
