"""The dashboard's pages in-process, on both databases: sign-in and its cookie, redirects,
CSRF refusals, the template form's validation, paging and sorting parameters, actions, and
the JSON feeds the charts and the log view poll."""

from __future__ import annotations

import html
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from master.db.models import AllocationModel
from master.db.session import session_scope
from master.services import agents as agent_service
from master.services import scheduler, trial_compare
from master.services.logs import LogLine, append_logs
from master.services.metrics import GpuReading, MetricReading, MetricsBuffer
from resolute_proto.agent.v1 import agent_pb2 as pb
from tests.api.test_agent_link import connect, exited, hub_of, of_kind, sent
from tests.api.test_asha_search import connect_agent, start_queued, submit, trials_of, validate
from tests.factories import (
    EXPERIMENT_YAML,
    TEMPLATE_CONFIG,
    create_experiment,
    create_template,
    v1_file,
)
from tests.web.conftest import COOKIE, csrf_of, web_csrf

ORIGIN = {"Origin": "http://master"}
HTMX = {"HX-Request": "true"}


async def bearer(client: httpx.AsyncClient) -> None:
    """Also sign the client in to the API (the pages ignore this header; the API needs it)."""
    reply = await client.post("/api/v1/auth/login", json={"username": "determined"})
    assert reply.status_code == 200, reply.text
    client.headers["Authorization"] = f"Bearer {reply.json()['token']}"


async def post_form(
    client: httpx.AsyncClient, path: str, fields: dict[str, str], *, csrf: str | None
) -> httpx.Response:
    data = dict(fields)
    if csrf is not None:
        data["csrf_token"] = csrf
    return await client.post(path, data=data, headers=ORIGIN)


async def experiment_with_trials(client: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    reply = await create_experiment(client, **fields)
    assert reply.status_code == 200, reply.text
    experiment: dict[str, Any] = reply.json()["experiment"]
    return experiment


async def schedule(app: FastAPI) -> None:
    """One scheduling pass, as the master's loop runs it (the test app runs no loops)."""
    async with session_scope(app.state.session_factory) as session:
        await scheduler.run_pass(session, app.state.settings)


async def template_names(client: httpx.AsyncClient) -> list[str]:
    reply = await client.get("/api/v1/templates")
    return [t["name"] for t in reply.json()["templates"]]


# -- sign-in, sessions and redirects -----------------------------------------------------


async def test_pages_send_strangers_to_the_sign_in_form(anon: httpx.AsyncClient) -> None:
    reply = await anon.get("/ui/experiments?sort=name")
    assert reply.status_code == 303
    assert reply.headers["location"] == "/ui/login?next=%2Fui%2Fexperiments%3Fsort%3Dname"
    htmx = await anon.get("/ui/cluster", headers=HTMX)
    assert htmx.status_code == 204 and htmx.headers["hx-redirect"].startswith("/ui/login?next=")
    feed = await anon.get("/ui/trials/1/metrics.json")
    assert feed.status_code == 401 and feed.json()["code"] == 16
    anon.cookies.set(COOKIE, "not-a-token", domain="master", path="/ui")
    stale = await anon.get("/ui/tasks")
    assert stale.status_code == 303 and stale.headers["location"].startswith("/ui/login")
    assert 'resolute_session=""' in stale.headers["set-cookie"]  # the dead cookie is dropped
    form = await anon.get("/ui/login")
    assert form.status_code == 200 and 'name="username"' in form.text


async def test_root_redirects_browsers_and_leaves_api_clients_alone(
    anon: httpx.AsyncClient,
) -> None:
    browser = await anon.get("/", headers={"Accept": "text/html,application/xhtml+xml"})
    assert browser.status_code == 303 and browser.headers["location"] == "/ui/"
    client = await anon.get("/")
    assert client.status_code == 404 and client.json()["code"] == 5
    assert (await anon.get("/ui")).headers["location"] == "/ui/"
    assert (await anon.get("/info")).status_code == 200
    assert (await anon.get("/api/v1/experiments")).status_code == 401
    assert (await anon.get("/api/v1/nope")).json()["code"] == 5  # the API's own 404
    mistyped = await anon.get("/ui/experimentz")
    assert mistyped.status_code == 404 and "no page at /ui/experimentz" in mistyped.text


async def test_sign_in_sets_a_strict_http_only_cookie_holding_an_api_token(
    anon: httpx.AsyncClient,
) -> None:
    reply = await post_form(
        anon,
        "/ui/login",
        {"username": "determined", "password": "", "next": "/ui/tasks"},
        csrf=None,
    )
    assert reply.status_code == 303 and reply.headers["location"] == "/ui/tasks"
    cookie = reply.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
    token = anon.cookies[COOKIE]
    me = await anon.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"})
    assert me.json()["user"]["username"] == "determined"  # the same tokens as the API

    page = await anon.get("/ui/tasks")
    assert page.status_code == 200 and "determined" in page.text
    for header, value in (
        ("content-security-policy", "script-src 'self'"),
        ("x-frame-options", "DENY"),
        ("cache-control", "no-store"),
    ):
        assert value in page.headers[header]
    out = await post_form(anon, "/ui/logout", {}, csrf=csrf_of(page.text))
    assert out.status_code == 303 and out.headers["location"] == "/ui/login"
    me = await anon.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"})
    assert me.status_code == 401  # signing out deleted the session, not just the cookie


async def test_sign_in_refusals_show_on_the_form(anon: httpx.AsyncClient) -> None:
    wrong = await post_form(
        anon, "/ui/login", {"username": "determined", "password": "x"}, csrf=None
    )
    assert wrong.status_code == 200 and "invalid credentials" in wrong.text
    assert COOKIE not in wrong.cookies
    empty = await post_form(anon, "/ui/login", {"username": " ", "password": ""}, csrf=None)
    assert "Enter a username." in empty.text
    for target in ("//evil.example/ui/", "https://evil.example/", "/api/v1/me", "/ui/\\evil"):
        reply = await post_form(
            anon, "/ui/login", {"username": "admin", "password": "", "next": target}, csrf=None
        )
        assert reply.headers["location"] == "/ui/", target
    foreign = await anon.post(
        "/ui/login",
        data={"username": "admin", "password": ""},
        headers={"Origin": "https://evil.example"},
    )
    assert foreign.status_code == 403
    not_a_form = await anon.post(
        "/ui/login", json={"username": "admin", "password": ""}, headers=ORIGIN
    )
    assert not_a_form.status_code == 400


# -- CSRF ---------------------------------------------------------------------------------


async def test_state_changing_forms_refuse_missing_stale_or_foreign_requests(
    web: httpx.AsyncClient,
) -> None:
    await bearer(web)
    fields = {"name": "csrf-tpl", "config": "description: x\n"}
    missing = await post_form(web, "/ui/templates/_new", fields, csrf=None)
    assert missing.status_code == 403 and "security token" in missing.text
    stale = await post_form(web, "/ui/templates/_new", fields, csrf="0" * 64)
    assert stale.status_code == 403
    token = await web_csrf(web)
    foreign = await web.post(
        "/ui/templates/_new",
        data={**fields, "csrf_token": token},
        headers={"Origin": "https://evil.example"},
    )
    assert foreign.status_code == 403 and "another site" in foreign.text
    assert await template_names(web) == []
    logout = await post_form(web, "/ui/logout", {}, csrf=None)
    assert logout.status_code == 403
    assert (await web.get("/ui/tasks")).status_code == 200  # still signed in

    # Behind a proxy that rewrites Host, the original host is in X-Forwarded-Host.
    proxied = await web.post(
        "/ui/templates/_new",
        data={**fields, "name": "proxied", "csrf_token": token},
        headers={"Origin": "https://dash.example", "X-Forwarded-Host": "dash.example"},
    )
    assert proxied.status_code == 303
    await web.delete("/api/v1/templates/proxied")

    # htmx sends the token as a header instead of a field.
    via_header = await web.post(
        "/ui/templates/_new", data=fields, headers={**ORIGIN, "X-CSRF-Token": token}
    )
    assert via_header.status_code == 303
    assert await template_names(web) == ["csrf-tpl"]


async def test_a_token_from_another_session_is_refused(
    web: httpx.AsyncClient, app: FastAPI
) -> None:
    other = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://master")
    async with other:
        await post_form(other, "/ui/login", {"username": "admin", "password": ""}, csrf=None)
        theirs = await web_csrf(other)
    refused = await post_form(web, "/ui/templates/_new", {"name": "x", "config": ""}, csrf=theirs)
    assert refused.status_code == 403


# -- templates -----------------------------------------------------------------------------


async def test_template_form_shows_each_problem_beside_its_field(web: httpx.AsyncClient) -> None:
    await bearer(web)
    token = await web_csrf(web)
    bad_config = await post_form(
        web,
        "/ui/templates/_new",
        {"name": "cpu", "config": "resources:\n  slots_per_trial: -1\nnot_a_key: 1\n"},
        csrf=token,
    )
    assert bad_config.status_code == 200
    problems = field_error(bad_config.text, "config")
    assert "resources.slots_per_trial" in problems and "not_a_key" in problems
    assert field_error(bad_config.text, "name") is None
    assert "slots_per_trial: -1" in bad_config.text  # what was typed is kept

    bad_name = await post_form(
        web, "/ui/templates/_new", {"name": "-x", "config": "description: ok\n"}, csrf=token
    )
    assert "template name" in (field_error(bad_name.text, "name") or "")
    assert field_error(bad_name.text, "config") is None

    for text, expected in (
        ("resources: [1, 2\n", "invalid YAML at line"),
        ("- a list\n", "must be a YAML mapping"),
        ("", "an empty document"),
    ):
        reply = await post_form(
            web, "/ui/templates/_new", {"name": "cpu", "config": text}, csrf=token
        )
        assert expected in (field_error(reply.text, "config") or ""), reply.text
    assert await template_names(web) == []

    good = await post_form(
        web, "/ui/templates/_new", {"name": "cpu 2", "config": "description: ok\n"}, csrf=token
    )
    assert (
        good.status_code == 303 and good.headers["location"] == "/ui/templates/cpu%202?notice=saved"
    )
    again = await post_form(
        web, "/ui/templates/_new", {"name": "cpu 2", "config": "description: ok\n"}, csrf=token
    )
    assert "already exists" in (field_error(again.text, "name") or "")
    stored = (await web.get("/api/v1/templates/cpu 2")).json()["template"]["config"]
    assert stored == {"description": "ok"}


async def test_template_edits_are_validated_as_the_api_validates_them(
    web: httpx.AsyncClient,
) -> None:
    await bearer(web)
    assert (await create_template(web, "base")).status_code == 200
    page = await web.get("/ui/templates/base")
    assert page.status_code == 200 and "host_path: /mnt/ckpt" in page.text
    token = csrf_of(page.text)
    api_reply = await web.patch(
        "/api/v1/templates/base", json={"resources": {"slots_per_trial": -1}}
    )
    bad = await post_form(
        web, "/ui/templates/base", {"config": "resources:\n  slots_per_trial: -1\n"}, csrf=token
    )
    assert api_reply.status_code == 400
    assert api_reply.json()["details"][0]["path"] in field_error(bad.text, "config")
    assert (await web.get("/api/v1/templates/base")).json()["template"]["config"] == TEMPLATE_CONFIG

    good = await post_form(web, "/ui/templates/base", {"config": "description: new\n"}, csrf=token)
    assert good.status_code == 303
    assert (await web.get("/api/v1/templates/base")).json()["template"]["config"] == {
        "description": "new"
    }
    gone = await post_form(web, "/ui/templates/nope", {"config": "description: x\n"}, csrf=token)
    assert gone.status_code == 404 and "template nope not found" in gone.text


async def test_template_delete_asks_first(web: httpx.AsyncClient) -> None:
    await bearer(web)
    await create_template(web, "doomed")
    confirm = await web.get("/ui/templates/doomed/delete")
    assert confirm.status_code == 200 and "Delete template doomed?" in confirm.text
    assert await template_names(web) == ["doomed"]
    done = await post_form(web, "/ui/templates/doomed/delete", {}, csrf=csrf_of(confirm.text))
    assert done.status_code == 303 and done.headers["location"] == "/ui/templates?notice=deleted"
    assert await template_names(web) == []
    again = await post_form(web, "/ui/templates/doomed/delete", {}, csrf=csrf_of(confirm.text))
    assert again.status_code == 404


def field_error(html: str, field: str) -> str | None:
    match = re.search(rf'data-field="{field}">(.*?)</(p|ul)>', html, re.S)
    return re.sub(r"<[^>]+>", "", match.group(1)) if match else None


# -- lists, paging and sorting -------------------------------------------------------------


async def test_experiment_list_pages_and_sorts(web: httpx.AsyncClient) -> None:
    await bearer(web)
    ids = []
    for name in ("charlie", "alpha", "bravo"):
        config = EXPERIMENT_YAML.replace("name: mnist-random", f"name: {name}")
        ids.append((await experiment_with_trials(web, config=config))["id"])

    def shown(html: str) -> list[str]:
        return re.findall(r'<td><a href="/ui/experiments/\d+">([a-z]+)</a></td>', html)

    assert shown((await web.get("/ui/experiments")).text) == ["bravo", "alpha", "charlie"]
    by_name = await web.get("/ui/experiments", params={"sort": "name", "order": "asc"})
    assert shown(by_name.text) == ["alpha", "bravo", "charlie"]
    first = await web.get("/ui/experiments", params={"sort": "name", "per_page": 2})
    assert shown(first.text) == ["alpha", "bravo"]
    assert "1\u20132 of 3 experiments" in first.text
    second = await web.get("/ui/experiments", params={"sort": "name", "per_page": 2, "page": 2})
    assert shown(second.text) == ["charlie"]
    beyond = await web.get("/ui/experiments", params={"page": 9})
    assert beyond.status_code == 200 and "Last page" in beyond.text
    filtered = await web.get("/ui/experiments", params={"text": "RAV", "state": "ACTIVE"})
    assert shown(filtered.text) == ["bravo"]
    fragment = await web.get("/ui/experiments", headers=HTMX)
    assert fragment.text.startswith('<div id="experiments-table"') and "<html" not in fragment.text


async def test_bad_paging_and_sorting_parameters_are_refused_cleanly(
    web: httpx.AsyncClient,
) -> None:
    await bearer(web)
    experiment = await experiment_with_trials(web)
    for path in (
        "/ui/experiments?page=0",
        "/ui/experiments?page=abc",
        f"/ui/experiments?page={2**40}",
        "/ui/experiments?per_page=0",
        "/ui/experiments?per_page=1000",
        "/ui/experiments?sort=owner",
        "/ui/experiments?order=sideways",
        "/ui/experiments?state=RUNNING",
        f"/ui/experiments?text={'x' * 300}",
        "/ui/experiments?text=a%00b",
        "/ui/experiments?searcher=bayesian",
        "/ui/experiments?user=nobody",
        "/ui/templates?per_page=-1",
        "/ui/tasks?page=1.5",
        "/ui/cluster?per_page=x",
        "/ui/cluster?per_page=101",  # more agents than the chart feed answers for
        "/ui/experiments/-1",
        f"/ui/experiments/{2**40}",
        f"/ui/experiments/{experiment['id']}?trials_page=0",
        f"/ui/experiments/{experiment['id']}?trial=abc",
        f"/ui/experiments/{experiment['id']}?page=0",
        f"/ui/experiments/{experiment['id']}/live?trials_page=x",
    ):
        reply = await web.get(path)
        assert reply.status_code == 400, (path, reply.status_code)
        assert reply.headers["content-type"].startswith("text/html")
        assert 'class="problem"' in reply.text
    for path in ("/ui/trials/1/logs.json?rank=-1", "/ui/trials/1/logs.json?limit=100000"):
        reply = await web.get(path)
        assert reply.status_code == 400 and reply.json()["code"] == 3, path
    many = "&".join(f"agent=a{i}" for i in range(101))
    assert (await web.get(f"/ui/cluster/metrics.json?{many}")).status_code == 400
    for path in ("/ui/templates/a%00b", "/ui/templates/a%00b/delete"):
        reply = await web.get(path)
        assert reply.status_code in (400, 404), (path, reply.status_code)
    token = await web_csrf(web)
    for path in ("/ui/agents/a%00b/enable", "/ui/jobs/a%00b/priority", "/ui/templates/a%00/delete"):
        reply = await post_form(web, path, {"priority": "5"}, csrf=token)
        assert reply.status_code in (200, 400, 404), (path, reply.status_code)
        assert 'class="banner error"' in reply.text or 'class="problem"' in reply.text
    assert (await web.get("/ui/experiments/999")).status_code == 404
    assert (await web.get("/ui/trials/999/metrics.json")).status_code == 404


async def test_trial_and_compare_pages_refuse_bad_ids_and_parameters_cleanly(
    web: httpx.AsyncClient,
) -> None:
    await bearer(web)
    experiment = await experiment_with_trials(web)
    compare = f"/ui/experiments/{experiment['id']}/compare"
    many = "&".join(f"trial={i}" for i in range(101))
    for path, status in (
        ("/ui/trials/abc", 400),
        ("/ui/trials/-1", 400),
        ("/ui/trials/999", 404),
        ("/ui/trials/999/live", 404),
        (f"{compare}?group=testing", 400),
        (f"{compare}?trial=abc", 400),
        (f"{compare}?{many}", 400),
        (f"{compare}?trial=999", 404),
        (f"{compare}?trial={2**40}", 400),
        (f"{compare}?best=0", 400),
        (f"{compare}?best=101", 400),
        (f"{compare}?best=2&trial=1", 400),
        (f"{compare}?metric=a%00b", 400),
        ("/ui/experiments/999/compare", 404),
        ("/ui/checkpoints/no-such-checkpoint/download", 404),
    ):
        reply = await web.get(path)
        assert reply.status_code == status, (path, reply.status_code, reply.text[-300:])
        assert reply.headers["content-type"].startswith("text/html")
        assert 'class="problem"' in reply.text and 'href="/ui/experiments"' in reply.text, path
    # No metric reported yet: the page says so, and a named metric is refused in words.
    reply = await web.get(f"{compare}?metric=loss")
    assert reply.status_code == 200
    assert "named &#39;loss&#39;" in reply.text and "They report: none." in reply.text
    too_many = await web.get(f"{compare}?{many}")
    assert "trial: at most 100 trials in one chart; 101 were chosen" in too_many.text
    both = await web.get(f"{compare}?best=2&trial=1")
    assert "best: choose trials with trial=... or best=N, not both" in both.text


async def test_compare_refuses_a_trial_of_another_experiment_with_a_404_naming_it(
    web: httpx.AsyncClient,
) -> None:
    await bearer(web)
    mine = await experiment_with_trials(web)
    other = await experiment_with_trials(web)
    stranger = (await trials_of(web, other["id"]))[0]["id"]
    own = (await trials_of(web, mine["id"]))[0]["id"]
    reply = await web.get(f"/ui/experiments/{mine['id']}/compare?trial={own}&trial={stranger}")
    assert reply.status_code == 404
    assert (
        f"trial {stranger} is not a trial of experiment {mine['id']} "
        f"(it belongs to experiment {other['id']})"
    ) in html.unescape(reply.text)
    assert 'href="/ui/experiments"' in reply.text  # the navigation stays


def compare_chart(page: str) -> dict[str, Any]:
    """The data the compare page hands its chart (what app.js draws)."""
    found = re.search(r'<script type="application/json" id="compare-data">(.*?)</script>', page)
    assert found, "the page has a chart"
    chart: dict[str, Any] = json.loads(found.group(1))
    return chart


async def report_at(
    client: httpx.AsyncClient, trial_id: int, group: str, steps: int, metrics: dict[str, Any]
) -> None:
    tasks = (await client.get("/api/v1/tasks")).json()["allocationIdToSummary"]
    run = max(int(a.split(".")[1]) for a, t in tasks.items() if t.get("trialId") == trial_id)
    body = {
        "group": group,
        "metrics": {
            "trialId": trial_id,
            "trialRunId": run,
            "stepsCompleted": steps,
            "metrics": {"avgMetrics": metrics},
        },
    }
    reply = await client.post(f"/api/v1/trials/{trial_id}/metrics", json=body)
    assert reply.status_code == 200, reply.text


async def test_compare_thins_long_trials_to_every_nth_report_and_says_so(
    web: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    await bearer(web)
    experiment = await experiment_with_trials(web)
    long, short, silent = [t["id"] for t in await trials_of(web, experiment["id"])]
    for n in range(10):  # ordinals 0..9
        await report_at(web, long, "validation", (n + 1) * 10, {"validation_loss": 1 / (n + 1)})
    await report_at(web, long, "validation", 50, {"validation_loss": 9.0})  # a rerun's step 50
    for n in range(3):
        await report_at(web, short, "validation", (n + 1) * 10, {"validation_loss": 0.5})
    monkeypatch.setattr(trial_compare, "MAX_POINTS_PER_TRIAL", 4)
    page = await web.get(f"/ui/experiments/{experiment['id']}/compare")
    assert page.status_code == 200, page.text
    chart = compare_chart(page.text)
    assert chart["metric"] == "validation_loss"
    first, second, third = chart["trials"]
    # Every 4th report (ordinals 0, 4, 8) and the latest (9): 4 of 10 points.
    assert (first["id"], first["stride"], first["reports"]) == (long, 4, 10)
    assert first["steps"] == [10, 50, 90, 100]
    assert first["values"] == [1.0, 9.0, 1 / 9, 0.1]
    assert (second["id"], second["stride"], second["steps"]) == (short, 1, [10, 20, 30])
    assert (third["id"], third["steps"]) == (silent, [])
    note = re.search(r'<p class="thinned-note"[^>]*data-thinned="4">(.*?)</p>', page.text)
    assert note and "Thinned to every 4th report" in html.unescape(note.group(1))

    # Nothing over the limit: every report drawn, and no note.
    monkeypatch.setattr(trial_compare, "MAX_POINTS_PER_TRIAL", 2000)
    full = await web.get(f"/ui/experiments/{experiment['id']}/compare?trial={long}")
    assert compare_chart(full.text)["trials"][0]["steps"] == [n * 10 for n in range(1, 11)]
    assert "thinned-note" not in full.text
    # The trial page's own feed always reads every report.
    feed = (await web.get(f"/ui/trials/{long}/metrics.json")).json()
    assert len(feed["groups"]["validation"]["steps"]) == 10


async def test_compare_best_n_ranks_trials_by_the_searcher_metric(web: httpx.AsyncClient) -> None:
    await bearer(web)
    experiment = await experiment_with_trials(web)
    a, b, c = [t["id"] for t in await trials_of(web, experiment["id"])]
    for trial_id, losses in ((a, [0.9, 0.4]), (b, [0.2, 0.3]), (c, ["NaN", True])):
        for n, loss in enumerate(losses):
            await report_at(web, trial_id, "validation", (n + 1) * 10, {"validation_loss": loss})
    page = await web.get(f"/ui/experiments/{experiment['id']}/compare?best=2")
    assert page.status_code == 200, page.text
    assert [t["id"] for t in compare_chart(page.text)["trials"]] == [b, a]  # 0.2, then 0.4
    # A trial with no finite number is never "best"; a metric nobody reports is named.
    one = await web.get(f"/ui/experiments/{experiment['id']}/compare?best=5&metric=accuracy")
    assert "No selected trial reported a validation metric named &#39;accuracy&#39;" in one.text
    assert "They report: validation_loss." in one.text


# -- the experiment page and its actions ---------------------------------------------------


async def test_experiment_page_shows_config_sources_seeds_and_trials(
    web: httpx.AsyncClient, app: FastAPI
) -> None:
    await bearer(web)
    await create_template(web, "cpu")
    experiment = await experiment_with_trials(web, template="cpu")
    before = await web.get(f"/ui/experiments/{experiment['id']}")
    assert "waiting for the next scheduling pass" in before.text
    await schedule(app)
    page = await web.get(f"/ui/experiments/{experiment['id']}")
    assert page.status_code == 200
    sources = dict(
        re.findall(
            r'<tr data-key="([a-z_]+)"><th>[a-z_]+</th>'
            r'<td><span class="source [a-z-]+">([a-z +]+)<',
            page.text,
        )
    )
    assert sources["checkpoint_storage"] == "template"
    assert sources["bind_mounts"] == "template"
    assert sources["searcher"] == "config"
    assert sources["reproducibility"] == "config"
    assert sources["optimizations"] == "default"
    assert "<code>1234</code>" in page.text  # the experiment seed
    trials = (await web.get(f"/api/v1/experiments/{experiment['id']}/trials")).json()["trials"]
    for trial in trials:
        assert f'data-trial-id="{trial["id"]}"' in page.text
        assert f"<code>{trial['seed']}</code>" in page.text
    assert "name: mnist-random" in page.text  # the original YAML
    assert "NO_AGENTS" in page.text  # why the trials wait
    live = await web.get(f"/ui/experiments/{experiment['id']}/live")
    assert (
        live.text.startswith('<div id="experiment-live"') and 'hx-trigger="every 2s"' in live.text
    )
    other = await experiment_with_trials(web)
    wrong_trial = await web.get(f"/ui/experiments/{experiment['id']}?trial={other['id'] * 100}")
    assert wrong_trial.status_code in (400, 404)
    (other_trial, *_) = (await web.get(f"/api/v1/experiments/{other['id']}/trials")).json()[
        "trials"
    ]
    foreign = await web.get(f"/ui/experiments/{experiment['id']}?trial={other_trial['id']}")
    assert foreign.status_code == 400  # another experiment's trial, not a missing one
    assert "is not a trial of experiment" in foreign.text


async def test_the_trials_table_pages_through_every_trial(web: httpx.AsyncClient) -> None:
    await bearer(web)
    many = EXPERIMENT_YAML.replace("max_trials: 3", "max_trials: 30")
    assert many != EXPERIMENT_YAML
    experiment = await experiment_with_trials(web, config=many)
    trials = (await web.get(f"/api/v1/experiments/{experiment['id']}/trials")).json()["trials"]
    ids = sorted(t["id"] for t in trials)
    assert len(ids) == 30
    first = await web.get(f"/ui/experiments/{experiment['id']}")
    next_urls = re.findall(r'href="([^"]*trials_page=2[^"]*)"', first.text)
    assert next_urls, "the trials table links to its second page"
    second = await web.get(html.unescape(next_urls[0]))
    assert second.status_code == 200
    shown = {int(t) for t in re.findall(r'data-trial-id="(\d+)"', second.text)}
    assert shown == set(ids[25:])  # the trials the first page could not show


async def test_pause_activate_kill_and_a_refused_action(web: httpx.AsyncClient) -> None:
    await bearer(web)
    experiment = await experiment_with_trials(web)
    path = f"/ui/experiments/{experiment['id']}"
    token = await web_csrf(web)

    async def state() -> str:
        reply = await web.get(f"/api/v1/experiments/{experiment['id']}")
        result: str = reply.json()["experiment"]["state"]
        return result

    for action, expected in (
        ("pause", "STATE_PAUSED"),
        ("activate", "STATE_ACTIVE"),
        ("kill", "STATE_CANCELED"),
    ):
        reply = await post_form(web, f"{path}/{action}", {}, csrf=token)
        assert reply.status_code == 303 and reply.headers["location"] == path
        assert await state() == expected
    refused = await post_form(web, f"{path}/activate", {}, csrf=token)
    assert refused.status_code == 200 and 'class="banner error"' in refused.text
    assert "is CANCELED" in refused.text
    assert await state() == "STATE_CANCELED"
    unknown = await post_form(web, f"{path}/delete", {}, csrf=token)
    assert unknown.status_code == 400
    missing = await post_form(web, "/ui/experiments/999/kill", {}, csrf=token)
    assert missing.status_code == 404 and "experiment 999 not found" in missing.text


async def test_job_priority_changes_through_the_job_service(
    web: httpx.AsyncClient, app: FastAPI
) -> None:
    await bearer(web)
    experiment = await experiment_with_trials(web)
    await schedule(app)
    job = experiment["jobId"]
    page = await web.get("/ui/tasks")
    assert page.status_code == 200 and f'data-job-id="{job}"' in page.text
    assert "NO_AGENTS" in page.text
    token = csrf_of(page.text)
    for value, problem in (
        ("0", "between 1 and 99"),
        ("abc", "not a whole number"),
        ("--5", "not a whole number"),
        ("\u0663", "not a whole number"),  # an Arabic-Indic digit: isdigit() but not ours
        ("", ""),
    ):
        reply = await post_form(web, f"/ui/jobs/{job}/priority", {"priority": value}, csrf=token)
        assert reply.status_code == 200 and 'class="banner error"' in reply.text
        assert problem in reply.text
    unknown = await post_form(web, "/ui/jobs/nope/priority", {"priority": "5"}, csrf=token)
    assert "job nope not found" in unknown.text
    jobs = (await web.get("/api/v1/job-queues")).json()["jobs"]
    assert jobs[0]["priority"] == 42
    done = await post_form(web, f"/ui/jobs/{job}/priority", {"priority": "7"}, csrf=token)
    assert done.status_code == 303 and done.headers["location"] == "/ui/tasks?notice=priority"
    jobs = (await web.get("/api/v1/job-queues")).json()["jobs"]
    assert jobs[0]["priority"] == 7
    fragment = await web.get("/ui/tasks", headers=HTMX)
    assert fragment.text.startswith('<section id="tasks-live"')


# -- agents ---------------------------------------------------------------------------------


async def register(app: FastAPI, agent_id: str, device: str = "cpu") -> None:
    registration = agent_service.AgentRegistration(
        id=agent_id,
        resource_pool="default",
        devices=tuple(agent_service.Device(slot_id=i, type=device) for i in (0, 1)),
    )
    async with session_scope(app.state.session_factory) as session:
        await agent_service.register_agent(session, app.state.settings, registration)


def reading(millis: int, cpu: float, gpus: tuple[GpuReading, ...] = ()) -> MetricReading:
    return MetricReading(
        unix_millis=millis,
        cpu_util_simple=cpu,
        memory_free=8 * 2**30,
        memory_used=2 * 2**30,
        disk_throughput_read=0.0,
        disk_throughput_write=0.0,
        disk_iops=0.0,
        net_throughput_sent=0.0,
        net_throughput_recv=0.0,
        gpus=gpus,
    )


async def test_agents_show_slots_and_metrics_and_can_be_drained_disabled_enabled(
    web: httpx.AsyncClient, app: FastAPI
) -> None:
    await bearer(web)
    await register(app, "gpu box@1")
    buffer = MetricsBuffer()
    buffer.add("gpu box@1", [reading(1_000 + i * 1_000, 10.0 + i) for i in range(5)])
    async with session_scope(app.state.session_factory) as session:
        await buffer.flush(session)
    page = await web.get("/ui/cluster")
    assert page.status_code == 200
    assert 'data-agent-id="gpu box@1"' in page.text and "0 of 2 slots busy" in page.text
    assert "14%" in page.text  # the newest CPU sample
    samples = (await web.get("/ui/cluster/metrics.json", params={"agent": "gpu box@1"})).json()
    assert [s["cpu_util_simple"] for s in samples["agents"]["gpu box@1"]] == [10, 11, 12, 13, 14]
    newer = await web.get("/ui/cluster/metrics.json", params={"agent": "gpu box@1", "since": 4_000})
    assert [s["unixMillis"] for s in newer.json()["agents"]["gpu box@1"]] == [4_000, 5_000]

    token = csrf_of(page.text)
    base = "/ui/agents/gpu%20box%401"
    # Taking agents in and out of service is the admins': the default user is refused.
    refused = await post_form(web, f"{base}/disable", {}, csrf=token)
    assert refused.status_code == 200
    assert "disable an agent is for admins; user determined is not one" in refused.text
    agent = (await web.get("/api/v1/agents/gpu box@1")).json()["agent"]
    assert (agent["enabled"], agent["draining"]) == (True, False)
    signed_in = await web.post(
        "/ui/login",
        data={"username": "admin", "password": "", "next": "/ui/cluster"},
        headers={"Origin": "http://master"},
    )
    assert signed_in.status_code == 303, signed_in.text
    token = csrf_of((await web.get("/ui/cluster")).text)
    for action, enabled, draining in (
        ("drain", False, True),
        ("disable", False, False),
        ("enable", True, False),
    ):
        reply = await post_form(web, f"{base}/{action}", {}, csrf=token)
        assert reply.status_code == 303, reply.text
        agent = (await web.get("/api/v1/agents/gpu box@1")).json()["agent"]
        assert (agent["enabled"], agent["draining"]) == (enabled, draining), action
    missing = await post_form(web, "/ui/agents/nobody/drain", {}, csrf=token)
    assert missing.status_code == 200 and "agent nobody not found" in missing.text
    assert (await post_form(web, f"{base}/explode", {}, csrf=token)).status_code == 400


async def test_gpu_agents_get_gpu_series(web: httpx.AsyncClient, app: FastAPI) -> None:
    await register(app, "h200", device="cuda")
    gpus = tuple(
        GpuReading(
            index=i,
            uuid=f"GPU-{i}",
            gpu_util=40.0 + 20 * i,
            gpu_memory_used=2**33,
            gpu_free_memory=2**36,
            temperature_c=50.0,
            power_w=300.0,
        )
        for i in (0, 1)
    )
    buffer = MetricsBuffer()
    buffer.add("h200", [reading(1_000, 5.0, gpus)])
    async with session_scope(app.state.session_factory) as session:
        await buffer.flush(session)
    page = await web.get("/ui/cluster")
    card = page.text.split('data-agent-id="h200"')[1]
    assert 'data-chart="agent-util" data-agent="h200" data-gpus="2"' in card
    assert "cuda 0" in card and "50%" in card  # the mean GPU utilisation
    feed = (await web.get("/ui/cluster/metrics.json", params={"agent": "h200"})).json()
    assert [g["gpu_util"] for g in feed["agents"]["h200"][0]["gpus"]] == [40.0, 60.0]


# -- feeds ------------------------------------------------------------------------------------


async def test_metric_and_log_feeds(web: httpx.AsyncClient, app: FastAPI) -> None:
    await bearer(web)
    experiment = await experiment_with_trials(web)
    tasks = (await web.get("/api/v1/tasks")).json()["allocationIdToSummary"]
    task = next(t for t in tasks.values() if t["experimentId"] == experiment["id"])
    trial_id, allocation = task["trialId"], task["allocationId"]
    run = int(allocation.split(".")[1])
    for steps, loss in ((10, 1.0), (20, 0.5), (30, "NaN")):
        body = {
            "group": "training",
            "metrics": {
                "trialId": trial_id,
                "trialRunId": run,
                "stepsCompleted": steps,
                "metrics": {"avgMetrics": {"loss": loss, "note": "text"}},
            },
        }
        reply = await web.post(f"/api/v1/trials/{trial_id}/metrics", json=body)
        assert reply.status_code == 200, reply.text
    checkpoint = {
        "uuid": "0f9d6c2e-1111-4a5b-9c7d-000000000001",
        "state": "STATE_COMPLETED",
        "metadata": {"steps_completed": 20},
        "resources": {"model.pt": "2048", "optimizer.pt": "1024"},
        "training": {"trialId": trial_id},
        "taskId": task["taskId"],
        "allocationId": allocation,
    }
    saved = await web.post("/api/v1/checkpoints", json=checkpoint)
    assert saved.status_code == 200, saved.text
    page = await web.get(f"/ui/experiments/{experiment['id']}")
    row = re.search(
        r'<code title="0f9d6c2e-1111[^"]*">0f9d6c2e</code></td>(.*?)</tr>', page.text, re.S
    )
    assert row, "the checkpoint is listed"
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    assert cells[0] == str(trial_id) and cells[1] == "20" and cells[4] == "2"

    feed = (await web.get(f"/ui/trials/{trial_id}/metrics.json")).json()
    assert feed["final"] is False
    assert feed["groups"]["training"] == {
        "steps": [10, 20, 30],
        "series": {"loss": [1.0, 0.5, None]},
    }
    assert feed["groups"]["validation"] == {"steps": [], "series": {}}

    moment = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
    lines = [
        LogLine(allocation, rank, "stdout", moment, f"line {i} of rank {rank}\n")
        for i in range(3)
        for rank in (0, 1)
    ]
    async with session_scope(app.state.session_factory) as session:
        await append_logs(session, "agent-1", lines)
    everything = (await web.get(f"/ui/trials/{trial_id}/logs.json")).json()
    assert [line["message"] for line in everything["lines"]][:2] == [
        "line 0 of rank 0",
        "line 0 of rank 1",
    ]
    assert everything["finished"] is False
    rank1 = (await web.get(f"/ui/trials/{trial_id}/logs.json", params={"rank": 1})).json()
    assert {line["rank"] for line in rank1["lines"]} == {1} and len(rank1["lines"]) == 3
    after = (
        await web.get(
            f"/ui/trials/{trial_id}/logs.json",
            params={"after": rank1["lines"][0]["id"], "limit": 1},
        )
    ).json()
    assert len(after["lines"]) == 1 and after["lines"][0]["id"] > rank1["lines"][0]["id"]
    await web.post(f"/api/v1/experiments/{experiment['id']}/kill")
    ended = (
        await web.get(f"/ui/trials/{trial_id}/logs.json", params={"after": everything["last"]})
    ).json()
    assert ended == {"lines": [], "last": everything["last"], "finished": True}


# -- no input is a server error ---------------------------------------------------------------

fuzz = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
values = st.one_of(
    st.text(max_size=12),
    st.integers(-(2**65), 2**65).map(str),
    st.sampled_from(["", "0", "-1", "1e9", "asc", "name", "ACTIVE", "\u00e9", "%00", "a/b"]),
)


@fuzz
@given(name=st.text(max_size=20), config=st.text(max_size=200))
async def test_random_template_forms_never_fail_the_server(
    web: httpx.AsyncClient, name: str, config: str
) -> None:
    token = await web_csrf(web)
    before = await template_names_signed_in(web)
    reply = await post_form(web, "/ui/templates/_new", {"name": name, "config": config}, csrf=token)
    assert reply.status_code in (200, 303, 400), reply.text
    if reply.status_code != 303:
        assert await template_names_signed_in(web) == before


@fuzz
@given(
    params=st.dictionaries(
        st.sampled_from(
            [
                "page",
                "per_page",
                "sort",
                "order",
                "state",
                "text",
                "user",
                "searcher",
                "label",
                "trial",
                "trials_page",
                "interactive_page",
            ]
        ),
        values,
    )
)
async def test_random_list_parameters_never_fail_the_server(
    web: httpx.AsyncClient, params: dict[str, str]
) -> None:
    for path in ("/ui/experiments", "/ui/templates", "/ui/tasks", "/ui/cluster"):
        reply = await web.get(path, params=params)
        assert reply.status_code in (200, 400), (path, params, reply.status_code)


async def template_names_signed_in(client: httpx.AsyncClient) -> list[str]:
    """Templates as the page lists them (the fuzzed client has no API token)."""
    page = await client.get("/ui/templates", params={"per_page": 200})
    return re.findall(r'<td><a href="/ui/templates/[^"]+">([^<]*)</a></td>', page.text)


# -- Determined's scripts: the launch layout, and trials that could not run -----------------


DET_TRIAL_YAML = """\
name: det-script
entrypoint: python3 train.py
searcher: {name: single, metric: loss, max_length: 1}
"""
UNRUNNABLE = "/usr/bin/python3 lacks determined, torch + tensorboard (needs determined>=0.38)"


def launch_row(page: str) -> str:
    match = re.search(r'<div class="wide" id="launch-layout">(.*?)</div>', page, re.DOTALL)
    assert match, "the experiment page has no Launch row"
    return html.unescape(re.sub(r"<[^>]+>", "", match.group(1)))


def reason_cell(page: str, row: str) -> str:
    """The text of the Reason column of the row whose opening tag holds `row`."""
    match = re.search(row + r'[^>]*>.*?<td class="reason">(.*?)</td>', page, re.DOTALL)
    assert match, f"no row {row} with a reason cell"
    return html.unescape(re.sub(r"<[^>]+>", "", match.group(1))).strip()


async def test_the_experiment_page_says_how_the_entrypoint_is_launched_and_why(
    web: httpx.AsyncClient,
) -> None:
    await bearer(web)
    determined = await experiment_with_trials(
        web,
        config=DET_TRIAL_YAML,
        modelDefinition=[v1_file("train.py", b"import determined as det\n")],
    )
    row = launch_row((await web.get(f"/ui/experiments/{determined['id']}")).text)
    assert row.startswith("Launchper_agent: the entrypoint runs once per agent"), row
    assert row.endswith("(because train.py imports determined)"), row
    live = await web.get(f"/ui/experiments/{determined['id']}/live")  # the 2-second refresh
    assert launch_row(live.text) == row

    ours = await experiment_with_trials(
        web, config=DET_TRIAL_YAML, modelDefinition=[v1_file("train.py", b"import resolute\n")]
    )
    row = launch_row((await web.get(f"/ui/experiments/{ours['id']}")).text)
    assert row.startswith("Launchper_slot: the entrypoint runs once per slot"), row
    assert row.endswith("(because train.py does not import determined)"), row


async def unrunnable_trial(web: httpx.AsyncClient, app: FastAPI) -> tuple[int, int, str]:
    """A per_agent trial whose agent could not run its interpreter: ended in ERROR at once.
    Returns the experiment, trial and allocation ids."""
    hub = hub_of(app)
    agent = await connect(hub, "agent-a")
    experiment = await experiment_with_trials(
        web,
        config=DET_TRIAL_YAML,
        modelDefinition=[v1_file("train.py", b"import determined as det\n")],
    )
    await schedule(app)
    await hub.tick()
    (prepare,) = of_kind(sent(agent), "prepare")
    allocation_id: str = prepare.allocation_id
    ready = pb.AllocationPrepared(
        allocation_id=allocation_id, master_port=29500, extra_ports=[29501, 29502]
    )
    await hub.on_message(agent, pb.AgentMessage(prepared=ready))
    assert of_kind(sent(agent), "start")
    await hub.on_message(agent, exited(allocation_id, pb.EXIT_KIND_UNRUNNABLE, UNRUNNABLE))
    (trial,) = (await web.get(f"/api/v1/experiments/{experiment['id']}/trials")).json()["trials"]
    assert (trial["state"], trial["endReason"]) == ("STATE_ERROR", UNRUNNABLE)
    return experiment["id"], trial["id"], allocation_id


async def test_a_trial_that_could_not_run_shows_why_in_the_reason_column(
    web: httpx.AsyncClient, app: FastAPI
) -> None:
    await bearer(web)
    experiment_id, trial_id, _ = await unrunnable_trial(web, app)
    page = await web.get(f"/ui/experiments/{experiment_id}")
    assert page.status_code == 200
    assert f'data-trial-id="{trial_id}" data-state="ERROR"' in page.text
    assert reason_cell(page.text, f'<tr data-trial-id="{trial_id}"') == UNRUNNABLE
    assert "determined&gt;=0.38" in page.text  # escaped, never markup


async def test_the_tasks_page_keeps_an_allocation_that_failed_within_the_hour(
    web: httpx.AsyncClient, app: FastAPI
) -> None:
    await bearer(web)
    _, _, allocation_id = await unrunnable_trial(web, app)
    row = f'<tr data-allocation-id="{allocation_id}"'
    for page in (await web.get("/ui/tasks"), await web.get("/ui/tasks", headers=HTMX)):
        assert page.status_code == 200
        assert row in page.text
        assert reason_cell(page.text, row) == f"unrunnable: {UNRUNNABLE}"
        assert "Nothing is queued or running." not in page.text
    listed = (await web.get("/api/v1/tasks")).json()["allocationIdToSummary"]
    assert allocation_id not in listed  # the API lists it only when asked to

    # An hour later it is gone from the page too.
    async with session_scope(app.state.session_factory) as session:
        allocation = await session.get(AllocationModel, allocation_id)
        assert allocation is not None and allocation.ended_at is not None
        allocation.ended_at = allocation.ended_at - timedelta(hours=1, minutes=1)
    page = await web.get("/ui/tasks")
    assert row not in page.text and "Nothing is queued or running." in page.text


# -- ASHA searches: each trial's rung and why it stopped; the searcher's progress -----------


def rung_cell(page: str, trial_id: int) -> str | None:
    """The text of the Rung column of a trial's row; None when the table has no such column."""
    match = re.search(
        rf'<tr data-trial-id="{trial_id}"[^>]*>.*?(?:<td class="rung"[^>]*>(.*?)</td>|</tr>)',
        page,
        re.DOTALL,
    )
    assert match, f"no row for trial {trial_id}"
    return html.unescape(match.group(1)).strip() if match.group(1) is not None else None


def progress_cell(page: str, experiment_id: int) -> str:
    """The text of the Progress column of an experiment's row in the list."""
    row = re.search(
        rf'<td><a href="/ui/experiments/{experiment_id}">{experiment_id}</a></td>(.*?)</tr>',
        page,
        re.DOTALL,
    )
    assert row, f"no row for experiment {experiment_id}"
    cell = re.search(r'<td data-col="progress"[^>]*>(.*?)</td>', row.group(1), re.DOTALL)
    assert cell, "no progress column"
    return html.unescape(re.sub(r"<[^>]+>", "", cell.group(1))).strip()


async def test_an_asha_experiment_shows_each_trials_rung_and_why_the_searcher_stopped_it(
    web: httpx.AsyncClient, app: FastAPI
) -> None:
    await bearer(web)
    hub = hub_of(app)
    agent = await connect_agent(hub)
    experiment_id = await submit(web)  # async_halving: 2 rungs at 2 and 4 batches
    waiting = await web.get(f"/ui/experiments/{experiment_id}")
    assert "<th>Rung</th>" in waiting.text
    for trial in await trials_of(web, experiment_id):
        assert rung_cell(waiting.text, trial["id"]) == "bracket 0, below rung 0 (2 batches) of 2"
    assert await start_queued(app, hub, agent)
    first, second = await trials_of(web, experiment_id)
    await validate(web, first, {"loss": 1.0, "batches": 2})
    await validate(web, second, {"loss": 2.0, "batches": 2})  # the worse half of rung 0
    first, second = await trials_of(web, experiment_id)
    stop = "stopped by the searcher at rung 0 (2 batches): place 2 of 2, not in the top 1/2"
    assert second["endReason"] == stop

    for page in (
        await web.get(f"/ui/experiments/{experiment_id}"),
        await web.get(f"/ui/experiments/{experiment_id}/live"),  # the 2-second refresh
    ):
        assert page.status_code == 200
        assert rung_cell(page.text, first["id"]) == "bracket 0, rung 0 (2 batches) of 2"
        assert rung_cell(page.text, second["id"]) == (
            "bracket 0, rung 0 (2 batches) of 2; stopped at rung 0"
        )
        assert rung_cell(page.text, second["id"]) == second["searcher"]["summary"]
        assert f'data-trial-id="{second["id"]}" data-state="STOPPING_COMPLETED"' in page.text
        assert reason_cell(page.text, f'<tr data-trial-id="{second["id"]}"') == stop
        assert reason_cell(page.text, f'<tr data-trial-id="{first["id"]}"') == ""

    experiment = (await web.get(f"/api/v1/experiments/{experiment_id}")).json()["experiment"]
    assert 0 < experiment["progress"] < 1
    listed = await web.get("/ui/experiments")
    assert "<th>Progress</th>" in listed.text
    assert progress_cell(listed.text, experiment_id) == f"{experiment['progress'] * 100:.0f}%"

    # Other searchers' trials have no rungs: no Rung column, the table as before.
    other = await experiment_with_trials(web)
    page = await web.get(f"/ui/experiments/{other['id']}")
    assert "<th>Rung</th>" not in page.text and 'class="rung"' not in page.text
    (trial, *_) = (await web.get(f"/api/v1/experiments/{other['id']}/trials")).json()["trials"]
    assert rung_cell(page.text, trial["id"]) is None
    progress = (await web.get(f"/api/v1/experiments/{other['id']}")).json()["experiment"][
        "progress"
    ]
    shown = progress_cell((await web.get("/ui/experiments")).text, other["id"])
    assert shown == ("\u2013" if progress is None else f"{progress * 100:.0f}%")


# -- issue 28 part 5: the experiments list's columns and filters, and the tasks pages ------

GRID_YAML = """\
name: charlie
entrypoint: python3 train.py
hyperparameters:
  lr: {type: categorical, vals: [0.1, 0.2]}
searcher: {name: grid, metric: validation_loss, max_length: {batches: 100}}
"""
SINGLE_YAML = """\
name: bravo
entrypoint: python3 train.py
searcher: {name: single, metric: validation_loss, max_length: {batches: 100}}
"""


async def report_validation(
    client: httpx.AsyncClient, experiment_id: int, steps: int, value: Any
) -> None:
    """A validation report for the experiment's first trial, as its ranks would send it."""
    tasks = (await client.get("/api/v1/tasks")).json()["allocationIdToSummary"]
    task = min(
        (t for t in tasks.values() if t["experimentId"] == experiment_id),
        key=lambda t: t["trialId"],
    )
    body = {
        "group": "validation",
        "metrics": {
            "trialId": task["trialId"],
            "trialRunId": int(task["allocationId"].split(".")[1]),
            "stepsCompleted": steps,
            "metrics": {"avgMetrics": {"validation_loss": value}},
        },
    }
    reply = await client.post(f"/api/v1/trials/{task['trialId']}/metrics", json=body)
    assert reply.status_code == 200, reply.text


def listed(page: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr data-experiment-id="(\d+)">', page)]


def cell(page: str, experiment_id: int, column: str) -> str:
    row = re.search(rf'<tr data-experiment-id="{experiment_id}">(.*?)</tr>', page, re.S)
    assert row, f"no row for experiment {experiment_id}"
    found = re.search(rf'<td data-col="{column}"[^>]*>(.*?)</td>', row.group(1), re.S)
    assert found, f"no {column} column"
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", found.group(1))).split())


async def test_the_experiment_list_shows_searcher_trials_and_best_metric_sorts_and_filters(
    web: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    await bearer(web)
    config = EXPERIMENT_YAML.replace("name: mnist-random", "name: alpha\ndescription: ResNet base")
    alpha = (await experiment_with_trials(web, config=config))["id"]
    bravo = (await experiment_with_trials(web, config=SINGLE_YAML))["id"]
    charlie = (await experiment_with_trials(web, config=GRID_YAML))["id"]
    reply = await create_experiment(admin, config=SINGLE_YAML.replace("bravo", "delta"))
    delta = reply.json()["experiment"]["id"]
    for steps, value in ((10, 0.5), (20, 0.1368), (30, "NaN"), (40, 0.2)):
        await report_validation(web, alpha, steps, value)
    await report_validation(web, bravo, 10, 0.3)
    await report_validation(admin, delta, 10, 0.7)

    page = (await web.get("/ui/experiments")).text
    assert listed(page) == [delta, charlie, bravo, alpha]
    for header in ("Searcher", "Trials", "Best metric"):
        assert f">{header}</a></th>" in page, header
    assert [cell(page, alpha, c) for c in ("searcher", "trials", "best")] == [
        "random",
        "3",
        "validation_loss 0.1368",
    ]
    none = "\u2013"  # an en dash, as tables show a missing value
    assert [cell(page, charlie, c) for c in ("searcher", "trials", "best")] == ["grid", "2", none]

    async def order(**params: str) -> list[int]:
        reply = await web.get("/ui/experiments", params=params)
        assert reply.status_code == 200, (params, reply.text)
        return listed(reply.text)

    # No best metric yet comes last, either way round.
    assert await order(sort="best") == [alpha, bravo, delta, charlie]
    assert await order(sort="best", order="desc") == [delta, bravo, alpha, charlie]
    assert await order(sort="trials") == [alpha, charlie, delta, bravo]
    assert await order(sort="searcher") == [charlie, alpha, bravo, delta]
    assert await order(sort="name") == [alpha, bravo, charlie, delta]
    assert await order(sort="state", order="asc") == [alpha, bravo, charlie, delta]
    assert await order(sort="started", order="asc") == [alpha, bravo, charlie, delta]
    assert await order(sort="id", order="asc") == [alpha, bravo, charlie, delta]

    # The filter form sends every field, empty for "any".
    assert await order(state="", searcher="", user="", text="") == [delta, charlie, bravo, alpha]
    assert await order(searcher="grid") == [charlie]
    assert await order(text="resnet") == [alpha]  # the description, whatever the case
    assert await order(text="RAV") == [bravo]
    assert await order(text=str(charlie)) == [charlie]
    assert await order(user="admin") == [delta]
    assert await order(user="determined", searcher="single") == [bravo]
    await web.post(f"/api/v1/experiments/{charlie}/kill")
    assert await order(state="CANCELED") == [charlie]
    empty = await web.get("/ui/experiments", params={"text": "zzz"})
    assert listed(empty.text) == [] and "match these filters" in empty.text
    # The filters stay in the sort links, the pager and the form.
    filtered = (await web.get("/ui/experiments", params={"user": "determined"})).text
    assert "user=determined" in html.unescape(
        re.findall(r'<th[^>]*><a href="([^"]+)"', filtered)[0]
    )
    assert "<option selected>determined</option>" in filtered


async def test_bad_experiment_list_filters_say_what_is_wrong(web: httpx.AsyncClient) -> None:
    for params, says in (
        ({"sort": "best_metric"}, "sort: Input should be"),
        ({"text": "x" * 257}, "text: String should have at most 256 characters"),
        ({"user": "nobody"}, "user: there is no user named 'nobody'"),
        ({"searcher": "bayesian"}, "searcher: 'bayesian' is not one of single, grid, random"),
        ({"state": "RUNNING"}, "state: 'RUNNING' is not one of ACTIVE"),
    ):
        reply = await web.get("/ui/experiments", params=params)
        assert reply.status_code == 400, (params, reply.status_code)
        problem = re.search(r'<p class="problem" role="alert">(.*?)</p>', reply.text, re.S)
        assert problem and says in html.unescape(problem.group(1)), (params, reply.text[-800:])
        assert 'href="/ui/experiments"' in reply.text  # the navigation is kept


async def test_the_experiment_list_shows_labels_and_filters_by_one(
    web: httpx.AsyncClient,
) -> None:
    await bearer(web)
    config = SINGLE_YAML + "labels: [vision, 'base line']\n"
    vision = (await experiment_with_trials(web, config=config))["id"]
    other = (await experiment_with_trials(web, config=SINGLE_YAML + "labels: [nlp]\n"))["id"]
    plain = (await experiment_with_trials(web, config=GRID_YAML))["id"]
    assert (await web.put(f"/api/v1/experiments/{other}/labels/a%26b")).status_code == 200

    page = (await web.get("/ui/experiments")).text
    assert "<th>Labels</th>" in page
    assert cell(page, vision, "labels") == "vision base line"
    assert cell(page, other, "labels") == "nlp a&b"
    assert cell(page, plain, "labels") == ""
    # The form suggests the labels in use; each label links to the list filtered by it.
    assert '<option value="a&amp;b">' in page and '<option value="vision">' in page
    links = re.findall(r'<a class="label" href="([^"]+)"', page)
    assert "/ui/experiments?sort=id&order=desc&label=a%26b&per_page=50" in map(html.unescape, links)

    async def order(**params: str) -> list[int]:
        reply = await web.get("/ui/experiments", params=params)
        assert reply.status_code == 200, (params, reply.text)
        return listed(reply.text)

    assert await order(label="vision") == [vision]
    assert await order(label="base line") == [vision]
    assert await order(label="a&b") == [other]
    assert await order(label="Vision") == []  # exact, as the API's filter
    assert await order(label="vision", searcher="grid") == []
    assert await order(label="nlp", user="determined", text="bravo", state="ACTIVE") == [other]
    assert await order(state="", searcher="", user="", text="", label="") == [plain, other, vision]
    # The label stays in the sort links, the form, and the table's own refresh.
    filtered = await web.get("/ui/experiments", params={"label": "base line", "sort": "name"})
    sort_link = html.unescape(re.findall(r'<th[^>]*><a href="([^"]+)"', filtered.text)[0])
    assert "label=base+line" in sort_link
    assert 'name="label" value="base line"' in filtered.text
    refreshed = await web.get("/ui/experiments", params={"label": "base line"}, headers=HTMX)
    assert listed(refreshed.text) == [vision] and "<datalist" not in refreshed.text

    experiment_page = (await web.get(f"/ui/experiments/{vision}")).text
    shown = re.search(r'<div class="labels" id="experiment-labels">(.*?)</div>', experiment_page)
    assert shown and re.findall(r'<a class="label"[^>]*>([^<]*)</a>', shown.group(1)) == [
        "vision",
        "base line",
    ]
    assert 'href="/ui/experiments?label=base%20line"' in shown.group(1)
    bare = (await web.get(f"/ui/experiments/{plain}")).text
    assert re.search(r'id="experiment-labels">.*none.*</div>', bare)


async def test_bad_label_filters_say_what_is_wrong(web: httpx.AsyncClient) -> None:
    for label, says in (
        ("x" * 256, "label: the label is 256 characters long; at most 255"),
        ("a\tb", "label: the label holds a control character (U+0009)"),
        ("  ", "label: the label is only spaces"),
    ):
        reply = await web.get("/ui/experiments", params={"label": label})
        assert reply.status_code == 400, (label, reply.status_code)
        problem = re.search(r'<p class="problem" role="alert">(.*?)</p>', reply.text, re.S)
        assert problem and says in html.unescape(problem.group(1)), reply.text[-800:]


COMMAND = {"config": {"entrypoint": "sleep 600", "resources": {"slots": 0}}}


async def command_state(client: httpx.AsyncClient, task_id: str) -> str:
    reply = await client.get(f"/api/v1/commands/{task_id}")
    assert reply.status_code == 200, reply.text
    state: str = reply.json()["command"]["state"]
    return state


async def test_tasks_page_lists_commands_with_their_page_logs_and_kill(
    web: httpx.AsyncClient, admin: httpx.AsyncClient, app: FastAPI
) -> None:
    await bearer(web)
    mine = (await web.post("/api/v1/commands", json=COMMAND)).json()["command"]["id"]
    theirs = (await admin.post("/api/v1/commands", json=COMMAND)).json()["command"]["id"]

    page = (await web.get("/ui/tasks")).text
    rows = re.findall(r'<tr data-task-id="([^"]+)" data-state="([A-Z]+)">', page)
    assert rows == [(theirs, "PENDING"), (mine, "PENDING")]  # newest first
    row = re.search(rf'<tr data-task-id="{mine}".*?</tr>', page, re.S)
    assert row and ">command</td>" in row.group(0) and ">determined</td>" in row.group(0)
    assert f'href="/ui/tasks/{mine}#logs"' in row.group(0)
    assert f'action="/ui/tasks/{mine}/kill"' in row.group(0)
    assert "/proxy/" not in row.group(0)  # a command serves nothing to open
    live = await web.get("/ui/tasks", headers=HTMX)
    assert live.text.startswith('<section id="tasks-live"') and mine in live.text

    task_page = await web.get(f"/ui/tasks/{mine}")
    assert task_page.status_code == 200
    assert "sleep 600" in task_page.text and f'data-logs-url="/ui/tasks/{mine}/logs.json"' in (
        task_page.text
    )
    moment = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
    async with session_scope(app.state.session_factory) as session:
        await append_logs(
            session, "agent-1", [LogLine(f"{mine}.1", None, "stdout", moment, "hi\n")]
        )
    feed = (await web.get(f"/ui/tasks/{mine}/logs.json")).json()
    assert [line["message"] for line in feed["lines"]] == ["hi"] and feed["finished"] is False

    token = csrf_of(task_page.text)
    refused = await post_form(web, f"/ui/tasks/{theirs}/kill", {}, csrf=token)
    assert refused.status_code == 403
    assert "belongs to admin; only its owner or an admin may kill it" in html.unescape(refused.text)
    assert await command_state(admin, theirs) == "STATE_QUEUED"
    assert (await post_form(web, f"/ui/tasks/{mine}/kill", {}, csrf=None)).status_code == 403
    assert await command_state(web, mine) == "STATE_QUEUED"

    killed = await post_form(web, f"/ui/tasks/{mine}/kill", {}, csrf=token)
    assert killed.status_code == 303
    assert killed.headers["location"] == f"/ui/tasks/{mine}?notice=killed"
    assert await command_state(web, mine) == "STATE_TERMINATED"
    ended = await web.get(killed.headers["location"])
    assert "killed by determined" in ended.text and 'hx-trigger="every 2s"' not in ended.text
    assert f'action="/ui/tasks/{mine}/kill"' not in ended.text
    feed = (await web.get(f"/ui/tasks/{mine}/logs.json", params={"after": feed["last"]})).json()
    assert feed["finished"] is True
    # An admin may kill anyone's.
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://master"
    ) as browser:
        reply = await browser.post(
            "/ui/login", data={"username": "admin", "password": ""}, headers=ORIGIN
        )
        assert reply.status_code == 303
        admin_token = await web_csrf(browser)
        reply = await post_form(browser, f"/ui/tasks/{theirs}/kill", {}, csrf=admin_token)
        assert reply.status_code == 303
    assert await command_state(admin, theirs) == "STATE_TERMINATED"


async def test_a_shells_owner_is_shown_how_to_connect_and_nobody_else(
    web: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    """A shell serves no page to open: its owner sees `det shell open ID` (ssh through the
    master) on its page, linked from the list; others and an ended shell show no such line."""
    await bearer(web)
    shell = {"config": {"resources": {"slots": 0}}}
    mine = (await web.post("/api/v1/shells", json=shell)).json()["shell"]["id"]
    theirs = (await admin.post("/api/v1/shells", json=shell)).json()["shell"]["id"]

    listing = (await web.get("/ui/tasks")).text
    row = re.search(rf'<tr data-task-id="{mine}".*?</tr>', listing, re.S)
    assert row and f'href="/ui/tasks/{mine}#connect">Connect</a>' in row.group(0)
    assert "/proxy/" not in row.group(0)
    other_row = re.search(rf'<tr data-task-id="{theirs}".*?</tr>', listing, re.S)
    assert other_row and "#connect" not in other_row.group(0)

    shown = (await web.get(f"/ui/tasks/{mine}")).text
    assert f"<code>det shell open {mine}</code>" in shown and 'id="connect"' in shown
    assert "det shell open" not in (await web.get(f"/ui/tasks/{theirs}")).text

    assert (await web.post(f"/api/v1/shells/{mine}/kill")).status_code == 200
    assert "det shell open" not in (await web.get(f"/ui/tasks/{mine}")).text


async def test_unknown_tasks_get_the_not_found_page(web: httpx.AsyncClient) -> None:
    await bearer(web)
    experiment = await experiment_with_trials(web)
    trials = (await web.get(f"/api/v1/experiments/{experiment['id']}/trials")).json()["trials"]
    trial_task_id = trials[0]["taskId"]  # a trial's task: not a command, notebook...
    for task_id in ("no-such-task", trial_task_id):
        reply = await web.get(f"/ui/tasks/{task_id}")
        assert reply.status_code == 404, task_id
        assert f"task {task_id} not found" in reply.text
        assert '<a href="/ui/tasks"' in reply.text  # the navigation is kept
        feed = await web.get(f"/ui/tasks/{task_id}/logs.json")
        assert feed.status_code == 404 and feed.json()["code"] == 5
    token = await web_csrf(web)
    missing = await post_form(web, "/ui/tasks/no-such-task/kill", {}, csrf=token)
    assert missing.status_code == 404 and "task no-such-task not found" in missing.text
    assert (await web.get(f"/ui/tasks/{'x' * 65}")).status_code == 400


async def test_compare_reads_a_metric_whose_name_has_quotes_dots_and_accents(
    web: httpx.AsyncClient,
) -> None:
    """The database picks the value out of the JSON by key, whatever the key holds."""
    await bearer(web)
    experiment = await experiment_with_trials(web)
    trial_id = (await trials_of(web, experiment["id"]))[0]["id"]
    name = 'top-1 "acc." é/%'
    for steps in (10, 20):
        await report_at(web, trial_id, "validation", steps, {name: steps / 100, "x": True})
    page = await web.get(
        f"/ui/experiments/{experiment['id']}/compare", params={"trial": trial_id, "metric": name}
    )
    assert page.status_code == 200, page.text
    chart = compare_chart(page.text)
    assert chart["metric"] == name
    assert (chart["trials"][0]["steps"], chart["trials"][0]["values"]) == ([10, 20], [0.1, 0.2])
    # A boolean is no number: not offered, and named as unknown when asked for.
    unknown = await web.get(
        f"/ui/experiments/{experiment['id']}/compare", params={"trial": trial_id, "metric": "x"}
    )
    assert f"They report: {name}." in html.unescape(unknown.text)


async def test_archived_experiments_are_left_out_unless_asked_for(web: httpx.AsyncClient) -> None:
    await bearer(web)
    kept = (await experiment_with_trials(web, config=SINGLE_YAML))["id"]
    archived = (await experiment_with_trials(web, config=SINGLE_YAML))["id"]
    assert (await web.post(f"/api/v1/experiments/{archived}/kill")).status_code == 200
    assert (await web.post(f"/api/v1/experiments/{archived}/archive")).status_code == 200

    page = await web.get("/ui/experiments")
    assert listed(page.text) == [kept]
    shown = await web.get("/ui/experiments", params={"archived": "show"})
    assert listed(shown.text) == [archived, kept]
    assert 'name="archived" value="show" checked' in shown.text
    badge = r'<a href="/ui/experiments/{}">[^<]*</a> <span class="archived"'
    assert re.search(badge.format(archived), shown.text)
    assert not re.search(badge.format(kept), shown.text)
    # The choice stays in the sort links.
    sort_link = html.unescape(re.findall(r'<th[^>]*><a href="([^"]+)"', shown.text)[0])
    assert "archived=show" in sort_link
    experiment_page = (await web.get(f"/ui/experiments/{archived}")).text
    assert re.search(r'<p class="crumbs">.*<span class="archived"', experiment_page)
    bad = await web.get("/ui/experiments", params={"archived": "yes"})
    assert bad.status_code == 400 and "archived" in html.unescape(bad.text)


async def test_a_fork_links_to_its_parent(web: httpx.AsyncClient) -> None:
    await bearer(web)
    parent = (await experiment_with_trials(web, config=SINGLE_YAML))["id"]
    reply = await web.post("/api/v1/experiments", json={"config": SINGLE_YAML, "parentId": parent})
    assert reply.status_code == 200, reply.text
    fork = reply.json()["experiment"]["id"]
    page = (await web.get(f"/ui/experiments/{fork}")).text
    said = re.search(r'<span class="small muted" id="forked-from">(.*?)</span>', page)
    assert said and f'<a href="/ui/experiments/{parent}">experiment {parent}</a>' in said.group(1)
    assert 'id="forked-from"' not in (await web.get(f"/ui/experiments/{parent}")).text
