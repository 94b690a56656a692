from __future__ import annotations

from datetime import datetime

from master.db.models import UserModel
from master.schemas.common import WireInput, WireModel


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
