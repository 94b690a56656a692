"""Wire conventions shared by every schema: camelCase keys, every declared key always sent."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class WireModel(BaseModel):
    """Replies. Required keys are emitted even when empty: the official client indexes them."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class WireInput(BaseModel):
    """Requests. Unknown keys are errors; explicit nulls are accepted, as the client sends them."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class Pagination(WireModel):
    offset: int = 0
    limit: int = 0
    start_index: int = 0
    end_index: int = 0
    total: int = 0

    @classmethod
    def of(cls, offset: int, limit: int, returned: int, total: int) -> Pagination:
        start = min(offset, total)
        return cls(
            offset=offset, limit=limit, start_index=start, end_index=start + returned, total=total
        )
