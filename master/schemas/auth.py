from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field

from master.db.models import MAX_INT, UserModel, UserSessionModel
from master.schemas.common import Pagination, WireInput, WireModel


class LoginRequest(WireInput):
    username: str
    password: str | None = None
    is_hashed: bool | None = False


class User(WireModel):
    id: int
    username: str
    admin: bool
    active: bool
    display_name: str
    modified_at: datetime | None = None

    @classmethod
    def of(cls, row: UserModel) -> User:
        return cls(
            id=row.id,
            username=row.username,
            admin=row.admin,
            active=row.active,
            display_name=row.display_name,
            modified_at=row.created_at,
        )


class LoginResponse(WireModel):
    token: str
    user: User


class MeResponse(WireModel):
    user: User


class UserFields(WireInput):
    """Determined's v1User as its client sends it; read-only and Enterprise fields are
    accepted only at their harmless values."""

    username: str
    admin: bool = False
    active: bool = True
    display_name: str | None = None
    remote: bool | None = None
    agent_user_group: dict[str, Any] | None = None
    id: int | None = None
    modified_at: str | None = None
    last_auth_at: str | None = None


class CreateUserRequest(WireInput):
    user: UserFields
    password: str | None = None
    is_hashed: bool | None = False


class PatchUserRequest(WireInput):
    username: str | None = None
    display_name: str | None = None
    active: bool | None = None
    admin: bool | None = None
    password: str | None = None
    is_hashed: bool | None = False
    remote: bool | None = None
    agent_user_group: dict[str, Any] | None = None


class UserResponse(WireModel):
    user: User


class UserList(WireModel):
    users: list[User]
    pagination: Pagination


class AccessTokenRequest(WireInput):
    user_id: int = Field(ge=0, le=MAX_INT)
    lifespan: str | None = None
    description: str | None = None


class AccessTokenResponse(WireModel):
    token: str
    token_id: int


class TokenInfo(WireModel):
    id: int
    user_id: int
    username: str
    description: str
    created_at: datetime
    expiry: datetime
    revoked: bool
    token_type: str = "TOKEN_TYPE_ACCESS_TOKEN"

    @classmethod
    def of(cls, row: UserSessionModel, username: str) -> TokenInfo:
        return cls(
            id=row.id,
            user_id=row.user_id,
            username=username,
            description=row.description,
            created_at=row.created_at,
            expiry=row.expires_at,
            revoked=row.revoked_at is not None,
        )


class TokenList(WireModel):
    token_info: list[TokenInfo]
    pagination: Pagination


class PatchTokenRequest(WireInput):
    token_id: int | None = None
    description: str | None = None
    set_revoked: bool | None = None


class TokenInfoResponse(WireModel):
    token_info: TokenInfo
