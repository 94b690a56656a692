"""Webhooks on Determined's routes (the SDK's bindings and the web UI call these).

POST /api/v1/webhooks/custom, the trials' alerts, lives with the other trial reports
(master/api/routes/trials.py).
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from master.api.deps import CurrentActor, ObjectId, SessionDep, SettingsDep, after_commit
from master.schemas.experiments import Empty
from master.schemas.webhooks import (
    TestReply,
    Trigger,
    Webhook,
    WebhookCreate,
    WebhookList,
    WebhookPatch,
    WebhookReply,
)
from master.services import webhooks
from master.services.webhooks import WebhookView

router = APIRouter(prefix="/api/v1", tags=["Webhooks"])


def webhook_reply(view: WebhookView) -> Webhook:
    row = view.row
    return Webhook(
        id=row.id,
        name=row.name,
        url=row.url,
        webhook_type=f"WEBHOOK_TYPE_{row.webhook_type}",
        mode=f"WEBHOOK_MODE_{row.mode}",
        workspace_id=row.workspace_id or 0,
        triggers=[
            Trigger(
                id=t.id,
                trigger_type=f"TRIGGER_TYPE_{t.trigger_type}",
                condition=dict(t.condition or {}),
                webhook_id=row.id,
            )
            for t in view.triggers
        ],
    )


def _wake_shipper(request: Request) -> None:
    shipper = getattr(request.app.state, "webhook_shipper", None)
    if shipper is not None:
        shipper.wake()


@router.get("/webhooks")
async def list_webhooks(session: SessionDep, actor: CurrentActor) -> WebhookList:
    views = await webhooks.list_webhooks(session, actor)
    return WebhookList(webhooks=[webhook_reply(v) for v in views])


@router.post("/webhooks")
async def create_webhook(
    body: WebhookCreate, session: SessionDep, actor: CurrentActor
) -> WebhookReply:
    view = await webhooks.create_webhook(
        session,
        actor,
        name=body.name,
        url=body.url,
        webhook_type=body.webhook_type,
        mode=body.mode,
        workspace_id=body.workspace_id,
        triggers=body.triggers,
    )
    return WebhookReply(webhook=webhook_reply(view))


@router.delete("/webhooks/{webhook_id}")
async def delete_webhook(webhook_id: ObjectId, session: SessionDep, actor: CurrentActor) -> Empty:
    await webhooks.delete_webhook(session, actor, webhook_id)
    return Empty()


@router.patch("/webhooks/{webhook_id}")
async def patch_webhook(
    webhook_id: ObjectId,
    body: WebhookPatch,
    request: Request,
    session: SessionDep,
    actor: CurrentActor,
) -> Empty:
    await webhooks.patch_webhook(session, actor, webhook_id, body.url)
    after_commit(session, lambda: _wake_shipper(request))
    return Empty()


@router.post("/webhooks/{webhook_id}/test")
async def test_webhook(
    webhook_id: ObjectId, session: SessionDep, actor: CurrentActor, settings: SettingsDep
) -> TestReply:
    url, body = await webhooks.test_target(session, actor, webhook_id)
    await webhooks.send_test(settings, url, body)
    return TestReply(completed=True)
