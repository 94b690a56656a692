"""The dashboard's templates in workspaces: the list shows and filters by each template's
workspace, and the new-template form puts one in a workspace, its refusals beside the field."""

from __future__ import annotations

import html
import re

import httpx

from tests.factories import create_template
from tests.web.conftest import web_csrf
from tests.web.test_pages import bearer, field_error, post_form


async def new_workspace(client: httpx.AsyncClient, name: str) -> int:
    reply = await client.post("/api/v1/workspaces", json={"name": name})
    assert reply.status_code == 200, reply.text
    ws_id: int = reply.json()["workspace"]["id"]
    return ws_id


def rows(html: str) -> list[tuple[str, str]]:
    """(name, workspace) of each row of the templates table."""
    body = html.split('id="templates"', 1)[1].split("</tbody>", 1)[0]
    found = []
    for row in re.findall(r"<tr>(.*?)</tr>", body, re.S):
        cells = [
            re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td.*?>(.*?)</td>", row, re.S)
        ]
        if len(cells) == 4:
            found.append((cells[0], cells[1]))
    return found


async def test_the_list_shows_and_filters_by_workspace(web: httpx.AsyncClient) -> None:
    await bearer(web)
    vision = await new_workspace(web, "vision")
    assert (await create_template(web, "plain")).status_code == 200
    token = await web_csrf(web)
    form = {"name": "seen", "config": "description: ok\n", "workspace": str(vision)}
    created = await post_form(web, "/ui/templates/_new", form, csrf=token)
    assert created.status_code == 303, created.text
    stored = (await web.get("/api/v1/templates/seen")).json()["template"]
    assert stored["workspaceId"] == vision

    page = await web.get("/ui/templates")
    assert rows(page.text) == [("plain", "Uncategorized"), ("seen", "vision")]
    filtered = await web.get("/ui/templates", params={"workspace": vision})
    assert rows(filtered.text) == [("seen", "vision")]
    assert f'<option value="{vision}" selected>vision</option>' in filtered.text
    # Its page says where it is.
    shown = await web.get("/ui/templates/seen")
    assert f'<a href="/ui/workspaces/{vision}">vision</a>' in shown.text
    assert (await web.get("/ui/templates", params={"workspace": "x"})).status_code == 400


async def test_the_form_refuses_a_bad_workspace_beside_the_field(web: httpx.AsyncClient) -> None:
    await bearer(web)
    frozen = await new_workspace(web, "frozen")
    assert (await web.post(f"/api/v1/workspaces/{frozen}/archive")).status_code == 200
    token = await web_csrf(web)
    for value, expected in (
        (str(frozen), f"workspace 'frozen' ({frozen}) is archived"),
        ("424242", "workspace 424242 not found"),
        ("two", "workspace: 'two' is not a whole number"),
    ):
        form = {"name": "late", "config": "description: ok\n", "workspace": value}
        reply = await post_form(web, "/ui/templates/_new", form, csrf=token)
        assert reply.status_code == 200, reply.text
        shown = html.unescape(field_error(reply.text, "workspace") or "")
        assert expected in shown, reply.text
        assert field_error(reply.text, "name") is None
    listed = (await web.get("/api/v1/templates")).json()["templates"]
    assert listed == []


async def test_the_form_puts_a_template_only_where_the_user_may(
    web: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    """As the API: a Viewer may not put templates in the workspace it reads, and one kept
    from the user is named as one that does not exist, archived or not."""
    vision = await new_workspace(admin, "vision")
    secret = await new_workspace(admin, "secret")
    assert (await admin.post(f"/api/v1/workspaces/{secret}/archive")).status_code == 200
    me = (await web.get("/api/v1/me")).json()["user"]["id"]
    scope = {"role": {"roleId": 4}, "scopeWorkspaceId": vision}  # Viewer
    body = {"userRoleAssignments": [{"userId": me, "roleAssignment": scope}]}
    assert (await admin.post("/api/v1/roles/add-assignments", json=body)).status_code == 200
    token = await web_csrf(web)
    for workspace, expected in (
        (vision, "may not put templates in workspace 'vision'"),
        (secret, f"workspace {secret} not found"),
    ):
        form = {"name": "mine", "config": "description: ok\n", "workspace": str(workspace)}
        reply = await post_form(web, "/ui/templates/_new", form, csrf=token)
        assert reply.status_code == 200, reply.text
        shown = html.unescape(field_error(reply.text, "workspace") or "")
        assert expected in shown, reply.text
        assert "secret" not in shown
    assert (await admin.get("/api/v1/templates")).json()["templates"] == []
