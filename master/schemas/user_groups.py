"""Determined's user group messages (v1Group, v1GroupDetails, v1GroupSearchResult and
their requests), as its `det user-group` sends and parses them."""

from __future__ import annotations

from typing import Any

from master.schemas.auth import User
from master.schemas.common import DbInt, Pagination, WireInput, WireModel
from master.services.user_groups import GroupDetails as GroupDetailsView
from master.services.user_groups import GroupSummary


class GroupCreate(WireInput):
    """v1CreateGroupRequest: the name is checked by the service, which names the field."""

    name: Any = None
    add_users: list[DbInt] | None = None


class GroupUpdate(WireInput):
    """v1UpdateGroupRequest; the client repeats the path's group id in the body."""

    group_id: DbInt | None = None
    name: Any = None
    add_users: list[DbInt] | None = None
    remove_users: list[DbInt] | None = None


class GroupSearch(WireInput):
    """v1GetGroupsRequest: `name` exactly, `userId` the groups that user is in; limit 0
    returns every group."""

    limit: DbInt = 0
    offset: DbInt = 0
    name: str | None = None
    user_id: DbInt | None = None


class Group(WireModel):
    group_id: int
    name: str


class GroupSearchResult(WireModel):
    group: Group
    num_members: int

    @classmethod
    def of(cls, summary: GroupSummary) -> GroupSearchResult:
        return cls(
            group=Group(group_id=summary.id, name=summary.name), num_members=summary.num_members
        )


class GroupList(WireModel):
    groups: list[GroupSearchResult]
    pagination: Pagination


class GroupDetails(WireModel):
    group_id: int
    name: str
    users: list[User]

    @classmethod
    def of(cls, view: GroupDetailsView) -> GroupDetails:
        return cls(group_id=view.id, name=view.name, users=[User.of(u) for u in view.members])


class GroupResponse(WireModel):
    """v1CreateGroupResponse, v1GetGroupResponse and v1UpdateGroupResponse alike."""

    group: GroupDetails
