"""``/api/webhooks`` and ``/api/notifiers``: where a job's events are pushed (admin
only), and each target's delivery log (:mod:`corral.notify`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Security

from corral.api.auth import Caller, bearer, require_admin
from corral.api.routers.network import ERRORS
from corral.api.services import Services, services
from corral.notify.models import DeliveryOut, HookOut, NotifierIn, WebhookIn
from corral.notify.service import ADDRESS_RULE_KEY, APPRISE, WEBHOOK
from corral.notify.urls import AddressRule, mask_url
from corral.service.users import Principal

router = APIRouter(
    prefix="/api",
    tags=["notifications"],
    dependencies=[Security(bearer), Depends(require_admin)],
    responses={403: {"description": "Not an admin."}},
)
Svc = Annotated[Services, Depends(services)]
Limit = Annotated[int, Query(ge=1, le=1000)]


@router.post(
    "/webhooks",
    status_code=201,
    responses=ERRORS,
    summary="Add a webhook",
    description="The events are POSTed as JSON with `X-Corral-Signature: sha256=<hex>`, the "
    "HMAC-SHA256 of the raw body under the secret, and retried with backoff. The secret "
    "is never returned.",
)
def add_webhook(body: WebhookIn, svc: Svc, who: Caller) -> HookOut:
    return _audited(svc, who, "webhook.add", svc.jobs.notifications.add_webhook(body))


@router.get("/webhooks", summary="Every webhook (no secrets)")
def list_webhooks(svc: Svc) -> list[HookOut]:
    return svc.jobs.notifications.targets(WEBHOOK)


@router.delete("/webhooks/{hook_id}", responses=ERRORS, summary="Remove a webhook")
def delete_webhook(hook_id: str, svc: Svc, who: Caller) -> HookOut:
    removed = svc.jobs.notifications.delete(WEBHOOK, hook_id)
    return _audited(svc, who, "webhook.remove", removed, removed=True)


@router.get("/webhooks/{hook_id}/deliveries", responses=ERRORS, summary="A webhook's delivery log")
def webhook_deliveries(hook_id: str, svc: Svc, limit: Limit = 100) -> list[DeliveryOut]:
    return svc.jobs.notifications.deliveries(WEBHOOK, hook_id, limit)


@router.post(
    "/notifiers",
    status_code=201,
    responses=ERRORS,
    summary="Add a chat or mail target (apprise URL)",
    description="One line per event with a link to the job page, through apprise "
    "(`slack://`, `discord://`, `msteams://`, `mailto://`, `json://`, ...; the `notify` "
    "extra). The URL is returned with its credentials masked.",
)
def add_notifier(body: NotifierIn, svc: Svc, who: Caller) -> HookOut:
    return _audited(svc, who, "notifier.add", svc.jobs.notifications.add_notifier(body))


@router.get("/notifiers", summary="Every chat or mail target (credentials masked)")
def list_notifiers(svc: Svc) -> list[HookOut]:
    return svc.jobs.notifications.targets(APPRISE)


@router.delete("/notifiers/{hook_id}", responses=ERRORS, summary="Remove a chat or mail target")
def delete_notifier(hook_id: str, svc: Svc, who: Caller) -> HookOut:
    removed = svc.jobs.notifications.delete(APPRISE, hook_id)
    return _audited(svc, who, "notifier.remove", removed, removed=True)


@router.get(
    "/notifiers/{hook_id}/deliveries", responses=ERRORS, summary="A notifier's delivery log"
)
def notifier_deliveries(hook_id: str, svc: Svc, limit: Limit = 100) -> list[DeliveryOut]:
    return svc.jobs.notifications.deliveries(APPRISE, hook_id, limit)


@router.get(
    "/notify/addresses",
    summary="The address rule of notifications",
    description="Which addresses webhooks (and apprise URLs naming an address) may reach "
    "besides public ones. Default: `loopback` and `private`; link-local addresses and "
    "the clouds' metadata endpoints are refused until an admin allows `link_local`.",
)
def get_address_rule(svc: Svc) -> AddressRule:
    return svc.jobs.notifications.address_rule()


@router.put(
    "/notify/addresses",
    responses=ERRORS,
    summary="Set the address rule of notifications",
    description="Holds from the next delivery on, for every target: a host is resolved "
    "at each delivery and every address it has must be allowed.",
)
def set_address_rule(body: AddressRule, svc: Svc, who: Caller) -> AddressRule:
    before = svc.jobs.notifications.address_rule()
    after = svc.jobs.notifications.set_address_rule(body)
    svc.audit.change(
        who.name,
        "notify.addresses",
        ADDRESS_RULE_KEY,
        before=before.model_dump(mode="json"),
        after=after.model_dump(mode="json"),
    )
    return after


def _audited(
    svc: Services, who: Principal, action: str, hook: HookOut, *, removed: bool = False
) -> HookOut:
    """``hook`` after its audit entry (its URL masked, never its secret)."""
    values = {
        "kind": hook.kind,
        "url": mask_url(hook.url),
        "events": hook.events,
        "signed": hook.has_secret,
    }
    svc.audit.added_or_removed(who.name, action, hook.id, values, removed=removed)
    return hook
