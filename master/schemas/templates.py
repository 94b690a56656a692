from __future__ import annotations

from typing import Any

from master.db.models import TemplateModel
from master.schemas.common import DbInt, Pagination, WireInput, WireModel
from resolute.storage import mask_config


class Template(WireModel):
    name: str
    config: dict[str, Any]
    workspace_id: int

    @classmethod
    def of(cls, row: TemplateModel) -> Template:
        return cls(name=row.name, config=mask_config(row.config), workspace_id=row.workspace_id)


class TemplateCreate(WireInput):
    name: str | None = None
    config: Any = None
    # 0 or none: the built-in workspace on create; on PUT of an existing one, stay put.
    workspace_id: DbInt | None = None


class TemplateRename(WireInput):
    old_name: str
    new_name: str


class TemplateResponse(WireModel):
    template: Template


class TemplateList(WireModel):
    templates: list[Template]
    pagination: Pagination
