"""Wire conventions shared by every schema: camelCase keys, every declared key always sent."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from master.db.models import MAX_INT

DbInt = Annotated[int, Field(ge=0, le=MAX_INT)]
"""An id or count a request sends: it must fit the database's 32-bit integers."""


def _storable_utc(moment: datetime) -> datetime:
    # A time without a zone is UTC, as in the log filters; one that leaves the years
    # 1..9999 once moved to UTC cannot be stored.
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        raise ValueError("is outside the years 1 to 9999 in UTC") from None


UtcTime = Annotated[datetime, AfterValidator(_storable_utc)]
"""A time a request sends, as stored: in UTC."""


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
