"""Webhooks without I/O: checking what a user asks for, which webhooks an event reaches,
the payloads (Determined's DEFAULT JSON and Slack's blocks), signatures and retry waits."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import re2

from master.core.text import any_unstorable, unstorable

DEFAULT = "DEFAULT"
SLACK = "SLACK"
WEBHOOK_TYPES = (DEFAULT, SLACK)
WORKSPACE = "WORKSPACE"
SPECIFIC = "SPECIFIC"
MODES = (WORKSPACE, SPECIFIC)
STATE_CHANGE = "EXPERIMENT_STATE_CHANGE"
METRIC_THRESHOLD = "METRIC_THRESHOLD_EXCEEDED"
TASK_LOG = "TASK_LOG"
CUSTOM = "CUSTOM"
TRIGGER_TYPES = (STATE_CHANGE, METRIC_THRESHOLD, TASK_LOG, CUSTOM)

# Experiment states a trigger may name (Determined's model.State, without STATE_).
EXPERIMENT_STATES = (
    "ACTIVE",
    "PAUSED",
    "STOPPING_COMPLETED",
    "STOPPING_CANCELED",
    "STOPPING_KILLED",
    "STOPPING_ERROR",
    "COMPLETED",
    "CANCELED",
    "ERROR",
    "DELETING",
)

SIGNATURE_HEADER = "X-Determined-AI-Signature"
TIMESTAMP_HEADER = "X-Determined-AI-Signature-Timestamp"
# Not Determined's: the event id in a header too, as a Slack body has no room for it.
EVENT_ID_HEADER = "X-Determined-AI-Event-Id"

_MAX_URL = 4096


class WebhookInputError(ValueError):
    """A webhook request that cannot be used; the message names the field."""


_MAX_NAME = 255
_MAX_REGEX = 1024


class LogPattern(Protocol):
    def search(self, text: str) -> object | None: ...


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused expression is the caller's error, not a log line


def log_pattern(regex: str) -> LogPattern:
    """A TASK_LOG trigger's regex, compiled with RE2: Determined matches it with Go's regexp,
    whose syntax RE2 is, and RE2 matches in time linear in the line, so no expression a
    workspace owner writes can stall the master on each log line (Python's re can take
    exponential time: `(a+)+$`). Raises re2.error."""
    pattern: LogPattern = re2.compile(regex, _RE2_OPTIONS)
    return pattern


def _wire_enum(value: object, prefix: str, known: Sequence[str], field: str) -> str:
    """Determined's enum names (WEBHOOK_TYPE_SLACK) or the short ones (SLACK)."""
    if not isinstance(value, str):
        raise WebhookInputError(f"{field}: must be one of {', '.join(prefix + k for k in known)}")
    short = value.removeprefix(prefix).upper()
    if short not in known:
        raise WebhookInputError(
            f"{field}: {value!r} is not one of {', '.join(prefix + k for k in known)}"
        )
    return short


def checked_type(value: object, field: str = "webhookType") -> str:
    return _wire_enum(value, "WEBHOOK_TYPE_", WEBHOOK_TYPES, field)


def checked_mode(value: object, field: str = "mode") -> str:
    if value in (None, "", "WEBHOOK_MODE_UNSPECIFIED"):
        return WORKSPACE  # Determined's default
    return _wire_enum(value, "WEBHOOK_MODE_", MODES, field)


def _printable(value: str, field: str) -> str:
    # NUL and other control characters cannot be stored (Postgres refuses NUL in text).
    if any(ord(c) < 32 and c not in "\t" for c in value):
        raise WebhookInputError(f"{field}: must not contain control characters")
    if unstorable(value):
        raise WebhookInputError(f"{field}: holds a lone surrogate")
    return value


def checked_url(value: object, field: str = "url") -> str:
    if not isinstance(value, str) or not value.strip():
        raise WebhookInputError(f"{field}: required, an http:// or https:// URL")
    url = _printable(value.strip(), field)
    if len(url) > _MAX_URL:
        raise WebhookInputError(f"{field}: longer than {_MAX_URL} characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise WebhookInputError(f"{field}: {url!r} is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookInputError(f"{field}: {url!r} is not an http:// or https:// URL with a host")
    return url


def checked_name(value: object, field: str = "name") -> str:
    if not isinstance(value, str) or not value.strip():
        raise WebhookInputError(f"{field}: required, a non-empty name")
    if len(value) > _MAX_NAME:
        raise WebhookInputError(f"{field}: longer than {_MAX_NAME} characters")
    return _printable(value.strip(), field)


@dataclass(frozen=True)
class TriggerSpec:
    trigger_type: str
    condition: dict[str, Any]


def checked_triggers(value: object, mode: str, field: str = "triggers") -> list[TriggerSpec]:
    if not isinstance(value, list) or not value:
        raise WebhookInputError(f"{field}: at least one trigger is required")
    triggers: list[TriggerSpec] = []
    for index, raw in enumerate(value):
        where = f"{field}[{index}]"
        if not isinstance(raw, Mapping):
            raise WebhookInputError(f"{where}: must be an object with triggerType and condition")
        kind = _wire_enum(
            raw.get("triggerType", raw.get("trigger_type")),
            "TRIGGER_TYPE_",
            TRIGGER_TYPES,
            f"{where}.triggerType",
        )
        condition = raw.get("condition") or {}
        if not isinstance(condition, Mapping):
            raise WebhookInputError(f"{where}.condition: must be an object")
        triggers.append(TriggerSpec(kind, _checked_condition(kind, condition, mode, where)))
    return triggers


def _checked_condition(
    kind: str, condition: Mapping[str, Any], mode: str, where: str
) -> dict[str, Any]:
    if kind == STATE_CHANGE:
        state = condition.get("state")
        if not isinstance(state, str) or state.removeprefix("STATE_") not in EXPERIMENT_STATES:
            raise WebhookInputError(
                f"{where}.condition.state: {state!r} is not an experiment state "
                f"({', '.join(EXPERIMENT_STATES)})"
            )
        return {"state": state.removeprefix("STATE_")}
    if kind == TASK_LOG:
        if set(condition) != {"regex"}:
            raise WebhookInputError(
                f"{where}.condition: a TASK_LOG trigger takes exactly one key, regex"
            )
        regex = condition["regex"]
        if not isinstance(regex, str) or not regex:
            raise WebhookInputError(f"{where}.condition.regex: must be a non-empty string")
        if unstorable(regex):
            raise WebhookInputError(
                f"{where}.condition.regex: holds a NUL character or a lone surrogate"
            )
        if len(regex) > _MAX_REGEX:
            raise WebhookInputError(f"{where}.condition.regex: longer than {_MAX_REGEX} characters")
        try:
            log_pattern(regex)
        except re2.error as exc:
            reason = exc.args[0].decode(errors="replace") if exc.args else "invalid"
            raise WebhookInputError(
                f"{where}.condition.regex: {regex!r} is not an RE2 expression (the syntax of "
                f"Determined's Go regexp; no back-references or look-arounds): {reason}"
            ) from None
        return {"regex": regex}
    if any_unstorable(dict(condition)):
        raise WebhookInputError(f"{where}.condition: holds a NUL character or a lone surrogate")
    if kind == CUSTOM and mode != SPECIFIC:
        # Determined's rule: custom events name their webhooks in the experiment's config.
        raise WebhookInputError(
            f"{where}.triggerType: a CUSTOM trigger needs mode WEBHOOK_MODE_SPECIFIC"
        )
    return dict(condition)


# -- which webhooks an event reaches --------------------------------------------------------


@dataclass(frozen=True)
class ExperimentWebhookConfig:
    """The experiment config's integrations.webhooks."""

    ids: tuple[int, ...] = ()
    names: tuple[str, ...] = ()
    exclude: bool = False
    present: bool = False

    @classmethod
    def of(cls, config: Mapping[str, Any] | None) -> ExperimentWebhookConfig:
        integrations = (config or {}).get("integrations") or {}
        raw = integrations.get("webhooks") if isinstance(integrations, Mapping) else None
        if not isinstance(raw, Mapping):
            return cls()
        ids = tuple(i for i in raw.get("webhook_id") or () if isinstance(i, int))
        names = tuple(n for n in raw.get("webhook_name") or () if isinstance(n, str))
        return cls(ids=ids, names=names, exclude=bool(raw.get("exclude")), present=True)


def reaches(
    webhook_id: int,
    name: str,
    mode: str,
    webhook_workspace_id: int | None,
    workspace_id: int | None,
    config: ExperimentWebhookConfig,
    is_experiment: bool,
) -> bool:
    """Determined's rule: an excluding experiment reaches none; a workspace's webhook only
    its own workspace; a SPECIFIC one only experiments whose config names it."""
    if config.exclude:
        return False
    if webhook_workspace_id is not None and webhook_workspace_id != workspace_id:
        return False
    if mode == SPECIFIC:
        if not is_experiment or not config.present:
            return False
        return webhook_id in config.ids or name in config.names
    return True


# -- payloads -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExperimentFacts:
    id: int
    state: str
    name: str
    duration_s: int
    resource_pool: str
    slots_per_trial: int
    workspace: str
    project: str


def default_payload(
    event_id: str,
    event_type: str,
    timestamp: int,
    condition: dict[str, Any],
    event_data: dict[str, Any],
) -> dict[str, Any]:
    return {
        "event_id": event_id,
        "event_type": event_type,
        "timestamp": timestamp,
        "condition": condition,
        "event_data": event_data,
    }


def experiment_data(facts: ExperimentFacts, trial_id: int | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": facts.id,
        "state": facts.state,
        "name": facts.name,
        "duration": facts.duration_s,
        "resource_pool": facts.resource_pool,
        "slots_per_trial": facts.slots_per_trial,
        "workspace": facts.workspace,
        "project": facts.project,
    }
    if trial_id:
        data["trial_id"] = trial_id
    return data


def _mrkdwn(text: str) -> dict[str, str]:
    return {"type": "mrkdwn", "text": text}


def slack_experiment_message(
    facts: ExperimentFacts,
    base_url: str,
    custom: Mapping[str, str] | None = None,
    trial_id: int | None = None,
) -> dict[str, Any]:
    """Slack's Block Kit message as Determined's shipper lays it out: a status line, then an
    attachment coloured by outcome with the experiment, its status and duration."""
    label = f"{facts.name} (#{facts.id})"
    link = f"<{base_url.rstrip('/')}/ui/experiments/{facts.id} | {label}>" if base_url else label
    if facts.state == "COMPLETED":
        status, colour, shown = "Your experiment completed successfully 🎉", "#13B670", "Completed"
        link = f"✅ {link}"
    elif facts.state == "ERROR":
        status, colour, shown = "Your experiment has stopped with errors", "#DD5040", "Errored"
        link = f"❌ {link}"
    else:
        status, colour = f"The status of your experiment is {facts.state}", "#009bde"
        shown = facts.state
    hours, rest = divmod(facts.duration_s, 3600)
    fields = [_mrkdwn(f"*Status*: {shown}"), _mrkdwn(f"*Duration*: {hours}h {rest // 60}min")]
    if facts.workspace:
        fields.append(_mrkdwn(f"*Workspace*: {facts.workspace}"))
    if facts.project:
        fields.append(_mrkdwn(f"*Project*: {facts.project}"))
    if trial_id:
        fields.append(_mrkdwn(f"*Trial ID*: {trial_id}"))
    message_block: dict[str, Any] = {
        "type": "section",
        "text": {"type": "plain_text", "text": status},
    }
    if custom is not None:
        message_block["fields"] = [
            _mrkdwn(f"*Level*: {custom.get('level', '')}"),
            _mrkdwn(f"*Title*: {custom.get('title', '')}"),
            _mrkdwn(f"*Description*: {custom.get('description', '')}"),
        ]
    return {
        "blocks": [message_block],
        "attachments": [
            {
                "color": colour,
                "blocks": [{"type": "section", "text": _mrkdwn(link), "fields": fields}],
            }
        ],
    }


def slack_log_message(
    task_id: str,
    node: str,
    line: str,
    regex: str,
    experiment_id: int | None,
    trial_id: int | None,
    base_url: str,
) -> dict[str, Any]:
    if trial_id is not None and experiment_id is not None:
        text = (
            f"Experiment ID `{experiment_id}`, Trial ID `{trial_id}`, running on node "
            f"`{node}`, reported a log\n```{line}```\nThis log matched the regex\n```{regex}```\n"
        )
        path = f"/ui/trials/{trial_id}"
        text += f"<{base_url.rstrip('/')}{path} | View full logs here>" if base_url else ""
    else:
        text = (
            f"Task ID `{task_id}`, running on node `{node}`, reported a log\n"
            f"```{line}```\nThis log matched the regex\n```{regex}```\n"
        )
    return {"blocks": [{"type": "section", "text": _mrkdwn(text)}]}


# -- delivery -------------------------------------------------------------------------------


def signature(key: bytes, timestamp: int, body: bytes) -> str:
    """What a receiver recomputes to trust a delivery: hex HMAC-SHA256 of "<t>,<body>"."""
    return hmac.new(key, str(timestamp).encode() + b"," + body, hashlib.sha256).hexdigest()


def retry_delay(attempts: int, initial_s: float, max_s: float) -> float:
    """Doubling from initial_s, capped at max_s; `attempts` failed so far (>= 1)."""
    return float(min(max_s, initial_s * 2 ** min(max(attempts - 1, 0), 30)))


class Outcome:
    DELIVERED = "delivered"
    RETRY = "retry"
    REFUSED = "refused"


def outcome_of(status: int) -> str:
    """2xx/3xx delivered; 4xx the receiver refuses it for good (Determined's rule, bar 408
    and 429, which say "later"); 5xx retried."""
    if status < 400:
        return Outcome.DELIVERED
    if status in (408, 429) or status >= 500:
        return Outcome.RETRY
    return Outcome.REFUSED
