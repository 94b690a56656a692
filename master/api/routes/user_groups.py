"""User groups, on Determined's routes (`det user-group ...`): anyone signed in may list
and describe them; creating, changing and deleting them is for admins."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from master.api.deps import CurrentActor, ObjectId, SessionDep
from master.errors import InvalidArgument
from master.schemas.common import Pagination
from master.schemas.user_groups import (
    GroupCreate,
    GroupDetails,
    GroupList,
    GroupResponse,
    GroupSearch,
    GroupSearchResult,
    GroupUpdate,
)
from master.services import access, user_groups

router = APIRouter(prefix="/api/v1", tags=["User groups"])


async def _details(session: SessionDep, group_id: int) -> GroupResponse:
    view = await user_groups.describe_group(session, group_id)
    return GroupResponse(group=GroupDetails.of(view))


@router.post("/groups")
async def create_group(
    body: GroupCreate, session: SessionDep, actor: CurrentActor
) -> GroupResponse:
    access.require_group_manager(actor, "creating user groups")
    group = await user_groups.create_group(session, body.name, body.add_users)
    return await _details(session, group.id)


@router.post("/groups/search")
async def search_groups(body: GroupSearch, session: SessionDep, _actor: CurrentActor) -> GroupList:
    found, total = await user_groups.search_groups(
        session, name=body.name, user_id=body.user_id, offset=body.offset, limit=body.limit
    )
    return GroupList(
        groups=[GroupSearchResult.of(g) for g in found],
        pagination=Pagination.of(body.offset, body.limit, len(found), total),
    )


@router.get("/groups/{group_id}")
async def get_group(group_id: ObjectId, session: SessionDep, _actor: CurrentActor) -> GroupResponse:
    return await _details(session, group_id)


@router.put("/groups/{group_id}")
async def update_group(
    group_id: ObjectId, body: GroupUpdate, session: SessionDep, actor: CurrentActor
) -> GroupResponse:
    access.require_group_manager(actor, "changing user groups")
    if body.group_id is not None and body.group_id != group_id:
        raise InvalidArgument(f"groupId: {body.group_id} is not the path's group {group_id}")
    await user_groups.update_group(
        session,
        group_id,
        name=body.name,
        add_user_ids=body.add_users,
        remove_user_ids=body.remove_users,
    )
    return await _details(session, group_id)


@router.delete("/groups/{group_id}")
async def delete_group(
    group_id: ObjectId, session: SessionDep, actor: CurrentActor
) -> dict[str, Any]:
    access.require_group_manager(actor, "deleting user groups")
    await user_groups.delete_group(session, group_id)
    return {}
