"""Webhooks on the wire: Determined's v1Webhook, v1Trigger and their requests.

Enums and conditions are checked by master.core.webhooks, so a wrong value is refused with a
message naming the field rather than a bare 422.
"""

from __future__ import annotations

from typing import Any

from master.schemas.common import DbInt, WireInput, WireModel


class Trigger(WireModel):
    id: int
    trigger_type: str
    condition: dict[str, Any]
    webhook_id: int


class Webhook(WireModel):
    id: int
    name: str
    url: str
    webhook_type: str
    mode: str
    workspace_id: int
    triggers: list[Trigger]


class WebhookCreate(WireInput):
    """POST /api/v1/webhooks: the body is the v1Webhook itself (grpc-gateway's body: webhook)."""

    name: Any = None
    url: Any = None
    webhook_type: Any = None
    mode: Any = None
    workspace_id: DbInt | None = None
    triggers: Any = None
    id: Any = None  # sent as null by the client's to_json; ignored


class WebhookPatch(WireInput):
    """PATCH /api/v1/webhooks/{id}: Determined's PatchWebhook (only the URL changes)."""

    url: Any = None


class WebhookReply(WireModel):
    webhook: Webhook


class WebhookList(WireModel):
    webhooks: list[Webhook]


class TestReply(WireModel):
    completed: bool
