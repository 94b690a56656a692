"""Unauthenticated cluster identity (`/info`) and `det master info`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from master.api.deps import CurrentUser
from master.version import DETERMINED_COMPAT_VERSION, __version__

router = APIRouter()


def _identity(request: Request) -> dict[str, Any]:
    state = request.app.state
    return {
        # The official client prints an upgrade hint for any other version string.
        "version": DETERMINED_COMPAT_VERSION,
        "masterId": state.master_id,
        "clusterId": state.cluster_id,
        "clusterName": state.settings.cluster_name,
        "resoluteVersion": __version__,
    }


@router.get("/info")
async def info(request: Request) -> dict[str, Any]:
    identity = _identity(request)
    # Determined's plain /info speaks snake_case; send both spellings of the ids.
    return {**identity, "master_id": identity["masterId"], "cluster_id": identity["clusterId"]}


@router.get("/api/v1/master")
async def master_info(request: Request, _user: CurrentUser) -> dict[str, Any]:
    return {
        **_identity(request),
        "hasCustomLogo": False,
        "strictJobQueueControl": False,
        "rbacEnabled": False,
        "telemetryEnabled": False,
        "ssoProviders": [],
        "externalLoginUri": "",
        "externalLogoutUri": "",
        "branding": "",
        "featureSwitches": [],
        "userManagementEnabled": True,
    }
