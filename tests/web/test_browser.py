"""The dashboard in a real browser: Debian's Chromium driven by Playwright against a real
det-master process with a real det-agent, as the issue's evidence asks.

Every test opens its pages through `page`, which fails the test on any console error or
uncaught exception. Screenshots of each page, at desktop and phone sizes, go to
$RESOLUTE_SCREENSHOTS or a temporary folder printed at the start.
"""

from __future__ import annotations

import asyncio
import json
import re
import tarfile
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert

from harness.cluster import AgentProcess
from master.core.thinning import thinning_level
from master.db.models import TrialMetricModel, TrialModel
from master.db.session import create_engine, create_session_factory, session_scope
from master.services import agents as agent_service
from master.services.agents import AgentRegistration, Device
from master.services.metrics import GpuReading, MetricReading, MetricsBuffer
from master.settings import MasterSettings, async_database_url
from tests.e2e.agents import create_experiment, trial_of, write_experiment
from tests.e2e.conftest import MasterProcess, unique
from tests.web.conftest import ConsoleLog

pytestmark = pytest.mark.e2e

DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
WAIT_MS = 60_000  # state changes on a shared two-core machine: generous, never timing-tight
TERMINAL = ("COMPLETED", "CANCELED", "ERROR")
TRIAL_STATE = "document.querySelector('#trials tr[data-trial-id]')?.dataset.state"

# Reports training metrics every step and validation every fourth, over REST with the
# variables the master gives every rank, as Determined's harness does.
REPORTING_SCRIPT = """\
import json, os, time, urllib.request

master = os.environ["DET_MASTER"].rstrip("/")
token = os.environ["DET_SESSION_TOKEN"]
trial = int(os.environ["DET_TRIAL_ID"])
run = int(os.environ["DET_TRIAL_RUN_ID"])

def report(group, steps, metrics):
    body = {"group": group, "metrics": {"trialId": trial, "trialRunId": run,
            "stepsCompleted": steps, "metrics": {"avgMetrics": metrics}}}
    request = urllib.request.Request(
        f"{master}/api/v1/trials/{trial}/metrics", data=json.dumps(body).encode(),
        method="POST", headers={"Authorization": f"Bearer {token}",
                                "Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=30).read()

for step in range(1, 9):
    loss = 1.0 / step
    report("training", step * 10, {"loss": loss, "accuracy": 1 - loss / 2})
    if step % 4 == 0:
        report("validation", step * 10, {"loss": loss * 1.1})
    print(f"step {step} loss {loss:.3f}", flush=True)
    time.sleep(0.5)
print("training done", flush=True)
"""

SLEEPER_SCRIPT = """\
import time
print("sleeping", flush=True)
time.sleep(600)
"""


def blocker_script(flag: Path) -> str:
    return textwrap.dedent(
        f"""\
        import pathlib, time
        print("holding the slot", flush=True)
        while not pathlib.Path({str(flag)!r}).exists():
            time.sleep(0.2)
        """
    )


@dataclass
class Cluster:
    master: MasterProcess
    agent: AgentProcess
    work: Path

    def submit(self, script: str, name: str, **options: Any) -> int:
        folder = self.work / unique(name)
        folder.mkdir()
        config, model = write_experiment(folder, script, name=name, **options)
        return create_experiment(self.master, config, model)

    def trial(self, experiment_id: int) -> dict[str, Any]:
        return trial_of(self.master, experiment_id)

    def wait_trial(self, experiment_id: int, states: set[str]) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            trial = self.trial(experiment_id)
            return trial if trial["state"].removeprefix("STATE_") in states else None

        result: dict[str, Any] = self.master.wait_for(
            f"experiment {experiment_id} trial in {sorted(states)}", reached, WAIT_MS / 1000
        )
        return result

    def kill(self, experiment_id: int) -> None:
        self.master.api("POST", f"/api/v1/experiments/{experiment_id}/kill")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("web-e2e")
    master = MasterProcess(work / "data", label="web")
    master.start()
    # One slot, so a second experiment has to queue behind the first.
    agent = AgentProcess(master, "web-agent", work / "agent", slots=1).start()
    try:
        agent.wait_connected()
        yield Cluster(master, agent, work)
    finally:
        agent.stop()
        master.stop()


@pytest.fixture
def page(browser: Any, cluster: Cluster) -> Iterator[Any]:
    """A signed-in page at desktop size; the test fails on any console error."""
    context = browser.new_context(viewport=DESKTOP, base_url=cluster.master.url)
    context.set_default_timeout(WAIT_MS)
    console = ConsoleLog()
    opened = context.new_page()
    console.watch(opened)
    in_flight: set[Any] = set()

    def started(request: Any) -> None:
        in_flight.add(request)

    def ended(request: Any) -> None:
        in_flight.discard(request)

    opened.on("request", started)
    opened.on("requestfinished", ended)
    opened.on("requestfailed", ended)
    sign_in(opened)
    yield opened
    let_requests_land(opened, in_flight)
    context.close()
    assert not console.errors, "\n".join(console.errors)


def let_requests_land(page: Any, in_flight: set[Any]) -> None:
    """Let a last poll land, so its errors count too: a moment for one to start, then until
    every request the page made has its answer (however slow the master is to give it)."""
    page.wait_for_timeout(300)
    deadline = time.monotonic() + WAIT_MS / 1000
    while in_flight and time.monotonic() < deadline:
        page.wait_for_timeout(100)  # Playwright delivers the page's events meanwhile


def sign_in(page: Any) -> None:
    page.goto("/ui/login")
    page.get_by_label("Username").fill("determined")
    page.get_by_label("Password").fill("")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/ui/cluster")


def record_trial_states(page: Any) -> None:
    """Keeps every trial state the page shows, in order, across htmx swaps; a reload
    would lose `window.__states`, which is how the test knows there was none."""
    page.evaluate(
        """() => {
        window.__states = [];
        const note = () => {
          const row = document.querySelector('#trials tr[data-trial-id]');
          const state = row && row.dataset.state;
          if (state && window.__states[window.__states.length - 1] !== state) {
            window.__states.push(state);
          }
        };
        note();
        new MutationObserver(note).observe(document.body, {childList: true, subtree: true});
    }"""
    )


def states_seen(page: Any) -> list[str]:
    states: list[str] = page.evaluate("() => window.__states")
    return states


def is_subsequence(wanted: list[str], seen: list[str]) -> bool:
    remaining = iter(seen)
    return all(any(state == item for item in remaining) for state in wanted)


# -- tests ---------------------------------------------------------------------------------


def test_sign_in_refuses_a_wrong_password_then_signs_in_and_out(
    browser: Any, cluster: Cluster
) -> None:
    context = browser.new_context(viewport=DESKTOP, base_url=cluster.master.url)
    console = ConsoleLog()
    page = context.new_page()
    console.watch(page)
    page.goto("/ui/experiments")
    page.wait_for_url(re.compile(r"/ui/login\?next="))
    page.get_by_label("Username").fill("determined")
    page.get_by_label("Password").fill("not-the-password")
    page.get_by_role("button", name="Sign in").click()
    assert page.get_by_role("alert").inner_text() == "invalid credentials"
    page.get_by_label("Password").fill("")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/ui/experiments")  # back where the redirect started
    assert page.locator("header .who span").inner_text() == "determined"
    cookie = next(c for c in context.cookies() if c["name"] == "resolute_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/ui/login")
    page.goto("/ui/cluster")
    page.wait_for_url(re.compile(r"/ui/login"))  # the session is gone on the master too
    context.close()
    assert not console.errors, "\n".join(console.errors)


def test_template_form_shows_validation_errors_next_to_the_field(
    page: Any, cluster: Cluster
) -> None:
    name = unique("tpl")
    page.goto("/ui/templates")
    page.get_by_role("link", name="New template").click()
    page.get_by_label("Name").fill(name)
    page.get_by_label(re.compile("^Config")).fill(
        "description: from the browser\nresources:\n  slots_per_trial: -1\n"
    )
    page.get_by_role("button", name="Create template").click()
    error = page.locator("[data-field=config]")
    assert "resources.slots_per_trial" in error.inner_text()
    assert page.get_by_label(re.compile("^Config")).get_attribute("aria-invalid") == "true"
    assert cluster.master.http("GET", f"/api/v1/templates/{name}").status_code == 404

    page.get_by_label("Name").fill("-bad name")
    page.get_by_role("button", name="Create template").click()
    assert "template name" in page.locator("[data-field=name]").inner_text()

    page.get_by_label("Name").fill(name)
    page.get_by_label(re.compile("^Config")).fill(
        "description: from the browser\nresources:\n  slots_per_trial: 1\n"
    )
    page.get_by_role("button", name="Create template").click()
    page.wait_for_url(f"**/ui/templates/{name}?notice=saved")
    stored = cluster.master.api("GET", f"/api/v1/templates/{name}")["template"]["config"]
    assert stored == {"description": "from the browser", "resources": {"slots_per_trial": 1}}

    page.get_by_label(re.compile("^Config")).fill("resources: [1, 2\n")
    page.get_by_role("button", name="Save").click()
    assert "invalid YAML" in page.locator("[data-field=config]").inner_text()
    assert cluster.master.api("GET", f"/api/v1/templates/{name}")["template"]["config"] == stored

    page.get_by_role("link", name="Delete…").click()
    page.get_by_role("button", name=f"Delete {name}").click()
    page.wait_for_url("**/ui/templates?notice=deleted")
    assert cluster.master.http("GET", f"/api/v1/templates/{name}").status_code == 404


def test_agent_utilisation_charts_draw_and_refresh_without_reload(
    page: Any, cluster: Cluster
) -> None:
    page.goto("/ui/cluster")
    card = page.locator(f"article.agent[data-agent-id='{cluster.agent.id}']")
    assert "connected" in card.locator(".badges").inner_text()
    page.evaluate("() => { window.__sameDocument = true; }")
    for kind in ("agent-util", "agent-mem"):
        chart = card.locator(f".chart[data-chart='{kind}']")
        page.wait_for_function(
            "el => Number(el.dataset.points) >= 2", arg=chart.element_handle(), timeout=WAIT_MS
        )
        assert chart.locator("canvas").count() == 1
    before = int(card.locator(".chart[data-chart='agent-util']").get_attribute("data-points"))
    # New samples arrive each second and the card itself is re-rendered by htmx every 3 s.
    page.wait_for_function(
        f"() => Number(document.querySelector(\"article.agent .chart[data-chart='agent-util']\")"
        f".dataset.points) > {before}",
        timeout=WAIT_MS,
    )
    assert page.evaluate("() => window.__sameDocument") is True


def add_gpu_agent(master: MasterProcess, agent_id: str) -> None:
    """Registers a disabled two-GPU agent with ten seconds of samples, through the services
    the agent link calls, into the running master's database (as tests/simulated.py does):
    CI has no GPU, and the charts' GPU series must be drawn by a browser too."""

    async def work() -> None:
        engine = create_engine(async_database_url("", master.data_dir))
        factory = create_session_factory(engine)
        devices = tuple(Device(slot_id=i, type="cuda", brand="NVIDIA H200") for i in (0, 1))
        try:
            async with session_scope(factory) as session:
                await agent_service.register_agent(
                    session,
                    MasterSettings(data_dir=master.data_dir),
                    AgentRegistration(id=agent_id, resource_pool="default", devices=devices),
                )
                # Disabled, so the scheduler never places a trial on an agent that is not there.
                await agent_service.disable_agent(session, agent_id, drain=False)
            now = int(time.time() * 1000)
            buffer = MetricsBuffer()
            buffer.add(agent_id, [gpu_reading(now - 10_000 + i * 1_000, i) for i in range(10)])
            async with session_scope(factory) as session:
                await buffer.flush(session)
        finally:
            await engine.dispose()

    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, work()).result()


def remove_agent(master: MasterProcess, agent_id: str) -> None:
    async def work() -> None:
        engine = create_engine(async_database_url("", master.data_dir))
        try:
            async with session_scope(create_session_factory(engine)) as session:
                await agent_service.remove_agent(session, agent_id)
        finally:
            await engine.dispose()

    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, work()).result()


def gpu_reading(millis: int, step: int) -> MetricReading:
    gpus = tuple(
        GpuReading(
            index=i,
            uuid=f"GPU-{i}",
            gpu_util=float(30 + 5 * step + 10 * i),
            gpu_memory_used=(20 + step) * 2**30,
            gpu_free_memory=100 * 2**30,
            temperature_c=55.0,
            power_w=400.0,
        )
        for i in (0, 1)
    )
    return MetricReading(
        unix_millis=millis,
        cpu_util_simple=12.0 + step,
        memory_free=900 * 2**30,
        memory_used=100 * 2**30,
        disk_throughput_read=0.0,
        disk_throughput_write=0.0,
        disk_iops=0.0,
        net_throughput_sent=0.0,
        net_throughput_recv=0.0,
        gpus=gpus,
    )


def test_gpu_series_are_drawn_for_an_agent_with_gpus(page: Any, cluster: Cluster) -> None:
    agent_id = unique("gpu-agent")
    add_gpu_agent(cluster.master, agent_id)
    try:
        page.goto("/ui/cluster")
        card = page.locator(f"article.agent[data-agent-id='{agent_id}']")
        assert card.locator(".slot").count() == 2
        for kind, legend in (("agent-util", "GPU %"), ("agent-mem", "GPU")):
            chart = card.locator(f".chart[data-chart='{kind}']")
            page.wait_for_function(
                "el => Number(el.dataset.points) >= 10", arg=chart.element_handle(), timeout=WAIT_MS
            )
            assert legend in chart.locator(".u-legend").inner_text()
        assert "GPU\n80%" in card.locator("dl.figures").inner_text()  # newest: 75 and 85
    finally:
        remove_agent(cluster.master, agent_id)


def test_experiment_goes_queued_running_completed_live_with_charts_and_logs(
    page: Any, cluster: Cluster
) -> None:
    flag = cluster.work / unique("release")
    blocker = cluster.submit(blocker_script(flag), unique("blocker"))
    try:
        cluster.wait_trial(blocker, {"RUNNING"})
        target = cluster.submit(REPORTING_SCRIPT, unique("reporting"))
        queued = cluster.master.wait_for(
            "the queued trial's reason",
            lambda: (t := cluster.trial(target))["pendingReason"] and t,
            WAIT_MS / 1000,
        )
        page.goto(f"/ui/experiments/{target}")
        record_trial_states(page)
        row = page.locator("#trials tr[data-trial-id]").first
        assert row.get_attribute("data-state") == "QUEUED"
        reason = row.locator("td.reason")
        assert queued["pendingReason"]["code"] in reason.inner_text()
        assert reason.inner_text().strip() != queued["pendingReason"]["code"]  # and words
    finally:
        flag.write_text("go\n")
    page.wait_for_function(f"() => {TRIAL_STATE} === 'COMPLETED'", timeout=WAIT_MS * 2)
    seen = states_seen(page)
    assert is_subsequence(["QUEUED", "RUNNING", "COMPLETED"], seen), seen
    assert page.locator("#experiment-live").get_attribute("data-state") == "COMPLETED"

    # The metrics charts draw every reported step; their values are the trial's own.
    api_rows = cluster.master.api("GET", f"/api/v1/trials/{queued['id']}/metrics")
    print("metrics through the API:", json.dumps(api_rows)[:300])
    training = page.locator("[data-group='training']")
    page.wait_for_function(
        "el => el.dataset.points === '8'", arg=training.element_handle(), timeout=WAIT_MS
    )
    assert training.locator("figcaption").all_inner_texts() == ["accuracy", "loss"]
    assert training.locator("canvas").count() == 2
    validation = page.locator("[data-group='validation']")
    page.wait_for_function(
        "el => el.dataset.points === '2'", arg=validation.element_handle(), timeout=WAIT_MS
    )

    # Logs: every line of rank 0, then only rank 0 when filtered (the single rank here).
    logs = page.locator("pre[data-logs]")
    page.wait_for_function(
        "el => el.textContent.includes('training done')",
        arg=logs.element_handle(),
        timeout=WAIT_MS,
    )
    assert "[rank 0] step 8 loss 0.125" in logs.inner_text()
    page.get_by_label("Rank").select_option("0")
    page.wait_for_function(
        "el => el.textContent.includes('training done')",
        arg=logs.element_handle(),
        timeout=WAIT_MS,
    )
    assert "The trial has ended" in page.locator("[data-log-status]").inner_text()
    cluster.wait_trial(blocker, {"COMPLETED"})


def test_tasks_page_shows_reasons_and_changes_a_priority(page: Any, cluster: Cluster) -> None:
    running = cluster.submit(SLEEPER_SCRIPT, unique("sleeper"))
    waiting = None
    try:
        cluster.wait_trial(running, {"RUNNING"})
        waiting = cluster.submit(SLEEPER_SCRIPT, unique("waiting"))
        trial = cluster.master.wait_for(
            "a pending reason",
            lambda: (t := cluster.trial(waiting))["pendingReason"] and t,
            WAIT_MS / 1000,
        )
        page.goto("/ui/tasks")
        pending = page.locator(f"#tasks tr:has(a[href*='/ui/experiments/{waiting}?'])")
        assert "PENDING" in pending.locator("td").nth(1).inner_text()
        assert trial["pendingReason"]["code"] in pending.locator("td.reason").inner_text()
        held = page.locator(f"#tasks tr:has(a[href*='/ui/experiments/{running}?'])")
        assert cluster.agent.id in held.inner_text()

        job_id = cluster.master.api("GET", f"/api/v1/experiments/{waiting}")["experiment"]["jobId"]
        row = page.locator(f"#jobs tr[data-job-id='{job_id}']")
        row.get_by_role("spinbutton").fill("7")
        row.get_by_role("button", name="Set").click()
        page.wait_for_url("**/ui/tasks?notice=priority")
        priority = page.locator(f"#jobs tr[data-job-id='{job_id}'] input[name=priority]")
        assert priority.input_value() == "7"
        jobs = cluster.master.api("GET", "/api/v1/job-queues")["jobs"]
        assert next(j for j in jobs if j["jobId"] == job_id)["priority"] == 7
    finally:
        if waiting is not None:
            cluster.kill(waiting)
        cluster.kill(running)
    cluster.wait_trial(running, set(TERMINAL))


def test_kill_an_experiment_from_its_page(page: Any, cluster: Cluster) -> None:
    experiment = cluster.submit(SLEEPER_SCRIPT, unique("to-kill"))
    cluster.wait_trial(experiment, {"RUNNING"})
    page.goto(f"/ui/experiments/{experiment}")
    dialogs: list[str] = []

    def accept(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.accept()

    page.once("dialog", accept)
    page.get_by_role("button", name="Kill").click()
    page.wait_for_url(f"**/ui/experiments/{experiment}")
    assert dialogs and "Kill experiment" in dialogs[0]
    page.wait_for_function(
        "() => ['CANCELED', 'ERROR'].includes("
        "document.querySelector('#experiment-live').dataset.state)",
        timeout=WAIT_MS,
    )
    assert cluster.master.api("GET", f"/api/v1/experiments/{experiment}")["experiment"][
        "state"
    ] in ("STATE_CANCELED",)
    assert page.get_by_role("button", name="Kill").count() == 0


def test_agent_can_be_drained_and_enabled_from_the_cluster_page(
    page: Any, cluster: Cluster
) -> None:
    from playwright.sync_api import expect  # here: the module is imported without Playwright

    page.goto("/ui/cluster")
    card = page.locator(f"article.agent[data-agent-id='{cluster.agent.id}']")
    # The default user is no admin: the agent's card offers no service buttons to it.
    assert card.get_by_role("button", name="Drain").count() == 0
    page.goto("/ui/login")
    page.get_by_label("Username").fill("admin")
    page.get_by_label("Password").fill("")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/ui/cluster")
    card.get_by_role("button", name="Drain").click()
    page.wait_for_url("**/ui/cluster")
    # The form posts, then comes back to this same address: wait for the page that says so.
    expect(card.locator(".badges")).to_contain_text("draining", timeout=WAIT_MS)
    assert cluster.master.api("GET", f"/api/v1/agents/{cluster.agent.id}")["agent"]["draining"]
    card.get_by_role("button", name="Enable").click()
    page.wait_for_url("**/ui/cluster")
    expect(card.locator(".badges")).to_contain_text("enabled", timeout=WAIT_MS)
    agent = cluster.master.api("GET", f"/api/v1/agents/{cluster.agent.id}")["agent"]
    assert agent["enabled"] and not agent["draining"]


def test_a_workspaces_page_shows_its_quota_and_the_list_its_quota_column(
    page: Any, cluster: Cluster
) -> None:
    from playwright.sync_api import expect

    admin = {"Authorization": f"Bearer {cluster.master.login('admin')}"}
    name = unique("quota-team")
    workspace = cluster.master.api("POST", "/api/v1/workspaces", json={"name": name})["workspace"]
    quota = f"/api/v1/workspaces/{workspace['id']}/quotas/default"
    # It lends all of it: the other tests' experiments keep the pool's one slot.
    body = {"nominalSlots": 1, "borrowingLimit": 0}
    cluster.master.api("PUT", quota, json=body, headers=admin)
    try:
        page.goto(f"/ui/workspaces/{workspace['id']}")
        row = page.locator("#quotas tr[data-pool='default']")
        expect(row.locator("td")).to_have_text(["default", "1", "0", "no limit", "0", "0", "api"])
        page.goto("/ui/workspaces")
        listed = page.locator(f"#workspaces tr[data-workspace='{name}'] td.quota")
        expect(listed).to_have_text("1 slot in default, holds 0")
    finally:
        cluster.master.api("DELETE", quota, headers=admin)


SCREENSHOT_PAGES = [
    ("cluster", "/ui/cluster", ".chart[data-chart='agent-util']"),
    ("workspaces", "/ui/workspaces", None),
    ("workspace", "/ui/workspaces/1", None),  # Uncategorized, where these experiments are
    ("experiments", "/ui/experiments", None),
    ("experiment", "/ui/experiments/{shown}", "[data-group='training']"),
    ("experiment-queued", "/ui/experiments/{waiting}", None),
    ("tasks", "/ui/tasks", None),
    ("templates", "/ui/templates", None),
    ("template", "/ui/templates/{tpl}", None),
    ("template-new", "/ui/templates/_new", None),
    ("template-delete", "/ui/templates/{tpl}/delete", None),
]


def test_screenshots_of_every_page(browser: Any, cluster: Cluster, screenshot_dir: Path) -> None:
    started = time.time() - 1
    shown = cluster.submit(REPORTING_SCRIPT, unique("shown"))
    cluster.wait_trial(shown, {"COMPLETED"})
    tpl = unique("shared")
    cluster.master.api(
        "POST",
        f"/api/v1/templates/{tpl}",
        json={"config": {"description": "shared", "resources": {"slots_per_trial": 1}}},
    )
    # A busy slot, a running trial and a queued one with its reason, for the pictures.
    running = cluster.submit(SLEEPER_SCRIPT, unique("sleeper"))
    waiting: int | None = None
    try:
        cluster.wait_trial(running, {"RUNNING"})
        waiting = cluster.submit(SLEEPER_SCRIPT, unique("waiting"))
        cluster.master.wait_for(
            "a pending reason", lambda: cluster.trial(waiting)["pendingReason"], WAIT_MS / 1000
        )
        take_screenshots(browser, cluster, screenshot_dir, shown, waiting, tpl)
    finally:
        if waiting is not None:
            cluster.kill(waiting)
        cluster.kill(running)
    print(f"dashboard screenshots: {screenshot_dir}")
    names = ["login", "template-errors", *(name for name, _url, _chart in SCREENSHOT_PAGES)]
    for name in names:
        for label in ("desktop-1280x800", "phone-390x844"):
            shot = screenshot_dir / f"{name}-{label}.png"
            assert shot.stat().st_mtime >= started and shot.stat().st_size > 5_000, shot


def take_screenshots(
    browser: Any, cluster: Cluster, folder: Path, shown: int, waiting: int, tpl: str
) -> None:
    values = {"shown": shown, "waiting": waiting, "tpl": tpl}
    pages = [(name, url.format(**values), chart) for name, url, chart in SCREENSHOT_PAGES]
    console = ConsoleLog()
    for label, size in (("desktop-1280x800", DESKTOP), ("phone-390x844", PHONE)):
        context = browser.new_context(viewport=size, base_url=cluster.master.url)
        page = context.new_page()
        console.watch(page)
        page.goto("/ui/login")
        page.screenshot(path=str(folder / f"login-{label}.png"), full_page=True)
        sign_in(page)
        for name, url, chart in pages:
            page.goto(url)
            if chart:
                page.wait_for_function(
                    f'() => Number(document.querySelector("{chart}").dataset.points) >= 2',
                    timeout=WAIT_MS,
                )
            page.screenshot(path=str(folder / f"{name}-{label}.png"), full_page=True)
            assert_fits_width(page, f"{name} at {label}")
        page.goto("/ui/templates/_new")
        page.get_by_label("Name").fill("-no")
        page.get_by_label(re.compile("^Config")).fill("resources:\n  slots_per_trial: -1\n")
        page.get_by_role("button", name="Create template").click()
        page.locator("[data-field=config]").wait_for()
        page.screenshot(path=str(folder / f"template-errors-{label}.png"), full_page=True)
        assert_fits_width(page, f"template errors at {label}")
        context.close()
    assert not console.errors, "\n".join(console.errors)


def assert_fits_width(page: Any, what: str) -> None:
    """Nothing sticks out sideways (wide tables scroll inside their own box)."""
    overflow = page.evaluate(
        "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 1, f"{what} is {overflow}px too wide"


# -- issue 28: a new user's bugs, and the trial page ---------------------------------------

# Fails its first run on purpose (a restart with its reason), then logs INFO through
# Python's logging (to stderr, as logging does), says ERROR on stdout, reports two metrics
# of very different scales, ONE validation point (an ASHA trial stopped at rung 0 has just
# one) and a checkpoint.
TRIAL_SCRIPT = """\
import json, logging, os, sys
import resolute

if os.environ["DET_TRIAL_RUN_ID"] == "1":
    print("first run: failing on purpose", flush=True)
    sys.exit(3)
logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
logging.info("loading the data")
with resolute.init() as ctx:
    for step in range(1, 5):
        metrics = {"loss": 1.0 / step, "accuracy": 60.0 + 10 * step}
        ctx.train.report_training_metrics(steps_completed=step * 10, metrics=metrics)
    ctx.train.report_validation_metrics(steps_completed=40, metrics={"loss": 0.3})
    print("ERROR: the data had 3 bad rows", flush=True)
    if ctx.is_chief:
        with ctx.checkpoint.store_path(40, {"note": "final"}) as (path, uuid):
            (path / "state.json").write_text(json.dumps({"step": 40}))
print("trial done", flush=True)
"""

# Counts the canvas pixels of the first series' colour (#2f6fab): what a user sees drawn.
SERIES_PIXELS = """el => {
  const canvas = el.querySelector('canvas');
  if (!canvas) return 0;
  const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  let count = 0;
  for (let i = 0; i < data.length; i += 4) {
    if (Math.abs(data[i] - 47) < 30 && Math.abs(data[i + 1] - 111) < 30
        && Math.abs(data[i + 2] - 171) < 30 && data[i + 3] > 200) count += 1;
  }
  return count;
}"""

# Every string painted on a canvas (uPlot paints its axes' labels and ticks there).
RECORD_PAINTED_TEXT = """
window.__painted = [];
const fillText = CanvasRenderingContext2D.prototype.fillText;
CanvasRenderingContext2D.prototype.fillText = function (text, ...rest) {
  window.__painted.push(String(text));
  return fillText.call(this, text, ...rest);
};
"""

# Each line of the log view with the colour it is shown in.
LOG_LINE_COLOURS = """pre => Array.from(pre.children).map(
  line => [line.textContent, getComputedStyle(line).color])"""


@dataclass
class TrialRun:
    experiment_id: int
    trial_id: int


@pytest.fixture(scope="module")
def trial_run(cluster: Cluster) -> TrialRun:
    """One finished trial the tests below look at from every side."""
    experiment = cluster.submit(
        TRIAL_SCRIPT,
        unique("trial-page"),
        max_restarts=2,
        extra={"hyperparameters": {"lr": 0.01, "layers": 3}},
    )
    trial = cluster.wait_trial(experiment, {"COMPLETED", "ERROR"})
    assert trial["state"] == "STATE_COMPLETED", trial
    return TrialRun(experiment, trial["id"])


def screenshot(page: Any, folder: Path, name: str) -> None:
    page.screenshot(path=str(folder / f"{name}-desktop-1280x800.png"), full_page=True)


def test_a_single_validation_point_is_drawn(
    page: Any, trial_run: TrialRun, screenshot_dir: Path
) -> None:
    page.goto(f"/ui/experiments/{trial_run.experiment_id}")
    validation = page.locator("[data-group='validation']")
    page.wait_for_function(
        "el => el.dataset.points === '1'", arg=validation.element_handle(), timeout=WAIT_MS
    )
    # uPlot draws a line between values; a single value needs its point drawn.
    page.wait_for_function(f"el => ({SERIES_PIXELS})(el) > 10", arg=validation.element_handle())
    validation.scroll_into_view_if_needed()
    screenshot(page, screenshot_dir, "single-validation-point")


def test_each_metric_has_its_own_chart_with_labelled_axes(
    page: Any, trial_run: TrialRun, screenshot_dir: Path
) -> None:
    page.add_init_script(RECORD_PAINTED_TEXT)
    page.goto(f"/ui/experiments/{trial_run.experiment_id}")
    training = page.locator("[data-group='training']")
    page.wait_for_function(
        "el => el.querySelectorAll('canvas').length === 2",
        arg=training.element_handle(),
        timeout=WAIT_MS,
    )
    # loss (0.25-1) and accuracy (70-100) each on a y axis of their own.
    assert training.locator("figcaption").all_inner_texts() == ["accuracy", "loss"]
    for name in ("accuracy", "loss"):
        legend = training.locator(f".chart[data-metric='{name}'] .u-legend")
        assert legend.locator(".u-series").count() == 1  # this metric alone
        assert name in legend.inner_text()
    page.wait_for_function("() => window.__painted.includes('batches')", timeout=WAIT_MS)
    painted = page.evaluate("() => window.__painted")
    assert {"batches", "loss", "accuracy"} <= set(painted), painted
    training.scroll_into_view_if_needed()
    screenshot(page, screenshot_dir, "metric-charts")


def test_log_lines_are_coloured_by_level_not_by_stream(
    page: Any, trial_run: TrialRun, screenshot_dir: Path
) -> None:
    page.goto(f"/ui/experiments/{trial_run.experiment_id}")
    logs = page.locator("pre[data-logs]")
    page.wait_for_function(
        "el => el.textContent.includes('trial done')", arg=logs.element_handle(), timeout=WAIT_MS
    )
    plain = page.evaluate("el => getComputedStyle(el).color", logs.element_handle())
    colours = dict(page.evaluate(LOG_LINE_COLOURS, logs.element_handle()))
    [info] = [c for text, c in colours.items() if "INFO: loading the data" in text]
    [error] = [c for text, c in colours.items() if "ERROR: the data had 3 bad rows" in text]
    [done] = [c for text, c in colours.items() if "trial done" in text]
    assert info == plain == done, colours  # INFO went to stderr: still a plain line
    assert error not in (plain, info), colours  # ERROR on stdout: still an error
    assert error == "rgb(242, 139, 130)", error
    logs.scroll_into_view_if_needed()
    screenshot(page, screenshot_dir, "log-levels")


def test_a_slot_held_by_a_command_names_and_links_the_command(
    page: Any, cluster: Cluster, trial_run: TrialRun, screenshot_dir: Path
) -> None:
    command = cluster.master.api(
        "POST",
        "/api/v1/commands",
        json={"config": {"entrypoint": "sleep 600", "resources": {"slots": 1}}},
    )["command"]
    task_id = command["id"]
    try:
        cluster.master.wait_for(
            "the command to run",
            lambda: (
                cluster.master.api("GET", f"/api/v1/commands/{task_id}")["command"]["state"]
                == "STATE_RUNNING"
            ),
            WAIT_MS / 1000,
        )
        page.goto("/ui/cluster")
        slot = page.locator(f"article.agent[data-agent-id='{cluster.agent.id}'] .slot.busy")
        slot.wait_for()
        assert slot.inner_text().split() == ["cpu", "0", "command", task_id[:8]]
        screenshot(page, screenshot_dir, "cluster-command-slot")
        slot.get_by_role("link").click()
        page.wait_for_url(f"**/ui/tasks#task-{task_id}")
        row = page.locator(f"#task-{task_id}")
        assert task_id in row.inner_text() and "RUNNING" in row.inner_text()
    finally:
        cluster.master.api("POST", f"/api/v1/commands/{task_id}/kill")
    cluster.master.wait_for(
        "the command to end",
        lambda: (
            cluster.master.api("GET", f"/api/v1/commands/{task_id}")["command"]["state"]
            == "STATE_TERMINATED"
        ),
        WAIT_MS / 1000,
    )


def test_an_agents_seen_time_moves_with_its_heartbeats(page: Any, cluster: Cluster) -> None:
    selector = f"article.agent[data-agent-id='{cluster.agent.id}'] p.muted"
    page.goto("/ui/cluster")
    first = re.search(r"seen (.+)$", page.locator(selector).first.inner_text())
    assert first, page.locator(selector).first.inner_text()
    # The card is re-rendered every 3 s (so the selector is asked again each time) and the
    # agent sends a heartbeat every second; it has not reconnected, so only the heartbeats
    # can move the time.
    page.wait_for_function(
        "([selector, was]) => !document.querySelector(selector).textContent"
        ".includes('seen ' + was)",
        arg=[selector, first.group(1)],
        timeout=20_000,
    )


def test_not_found_pages_keep_the_navigation_and_say_what_is_missing(
    browser: Any, cluster: Cluster, screenshot_dir: Path
) -> None:
    # Its own context: the console reports every 4xx page load, which is the point here.
    context = browser.new_context(viewport=DESKTOP, base_url=cluster.master.url)
    page = context.new_page()
    sign_in(page)
    for url, status, says in (
        ("/ui/trials/987654321", 404, "trial 987654321 not found"),
        ("/ui/no-such-page", 404, "no page at /ui/no-such-page"),
        ("/ui/experiments/987654321", 404, "experiment 987654321 not found"),
        ("/ui/experiments/five", 400, "experiment_id"),
        ("/ui/trials/five", 400, "trial_id"),
    ):
        reply = page.goto(url)
        assert reply.status == status, (url, reply.status)
        nav = page.locator("header.top nav")
        assert nav.get_by_role("link").all_inner_texts() == [
            "Cluster",
            "Workspaces",
            "Experiments",
            "Tasks",
            "Templates",
            "Models",
        ], url
        assert says in page.locator("main").inner_text(), url
    page.goto("/ui/trials/987654321")
    screenshot(page, screenshot_dir, "not-found")
    context.close()


def test_trial_page_shows_its_state_runs_charts_logs_and_checkpoints(
    browser: Any, page: Any, cluster: Cluster, trial_run: TrialRun, screenshot_dir: Path
) -> None:
    page.goto(f"/ui/experiments/{trial_run.experiment_id}")
    row = page.locator(f"#trials tr[data-trial-id='{trial_run.trial_id}']")
    row.get_by_role("link", name="trial page").click()
    page.wait_for_url(f"**/ui/trials/{trial_run.trial_id}")

    summary = page.locator("#trial-live")
    assert summary.get_attribute("data-state") == "COMPLETED"
    assert "COMPLETED" in summary.locator(".badge").first.inner_text()
    experiment_link = summary.get_by_role("link", name=str(trial_run.experiment_id))
    assert experiment_link.get_attribute("href").startswith(
        f"/ui/experiments/{trial_run.experiment_id}"
    )
    assert summary.locator("[data-restarts]").inner_text().startswith("1 ")
    runs = page.locator("#runs tbody tr")
    assert runs.count() == 2
    # The first run exited with 3 (a failure, counted as a restart); the second completed.
    assert "failed" in runs.nth(0).locator("td.reason").inner_text().lower()
    assert "COMPLETED" in runs.nth(1).locator("td.reason").inner_text().upper()
    assert page.locator("[data-hparam='lr'] td").inner_text() == "0.01"
    assert page.locator("[data-hparam='layers'] td").inner_text() == "3"

    training = page.locator("[data-group='training']")
    page.wait_for_function(
        "el => el.querySelectorAll('canvas').length === 2",
        arg=training.element_handle(),
        timeout=WAIT_MS,
    )
    validation = page.locator("[data-group='validation']")
    page.wait_for_function(f"el => ({SERIES_PIXELS})(el) > 10", arg=validation.element_handle())

    logs = page.locator("pre[data-logs]")
    page.wait_for_function(
        "el => el.textContent.includes('trial done')", arg=logs.element_handle(), timeout=WAIT_MS
    )
    assert "first run: failing on purpose" in logs.inner_text()
    page.get_by_label("Rank").select_option("0")
    page.wait_for_function(
        "el => el.textContent.includes('trial done')", arg=logs.element_handle(), timeout=WAIT_MS
    )

    checkpoint = page.locator("#checkpoints tr[data-checkpoint]")
    assert checkpoint.count() == 1
    uuid = checkpoint.get_attribute("data-checkpoint")
    with page.expect_download() as started:
        checkpoint.get_by_role("link").click()
    download = started.value
    assert download.suggested_filename == f"{uuid}.tar.gz"
    with tarfile.open(download.path(), "r:gz") as archive:
        stored = archive.extractfile("state.json")
        assert stored is not None and json.loads(stored.read()) == {"step": 40}

    screenshot(page, screenshot_dir, "trial")
    context = browser.new_context(viewport=PHONE, base_url=cluster.master.url)
    console = ConsoleLog()
    phone = context.new_page()
    console.watch(phone)
    sign_in(phone)
    phone.goto(f"/ui/trials/{trial_run.trial_id}")
    phone.locator("[data-group='training'] canvas").first.wait_for()
    phone.screenshot(path=str(screenshot_dir / "trial-phone-390x844.png"), full_page=True)
    assert_fits_width(phone, "the trial page at phone size")
    context.close()
    assert not console.errors, "\n".join(console.errors)


COMPARE_SCRIPT = """\
import resolute

with resolute.init() as ctx:
    lr = ctx.hparams["lr"]
    for step in range(1, 4):
        ctx.train.report_training_metrics(steps_completed=step * 10, metrics={"loss": lr / step})
    ctx.train.report_validation_metrics(steps_completed=30, metrics={"loss": lr / 3})
"""

# The canvas pixels of one colour, [r, g, b]: how much of a series a user sees drawn.
COLOUR_PIXELS = """([el, rgb]) => {
  const canvas = el.querySelector('canvas');
  if (!canvas) return 0;
  const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  let count = 0;
  for (let i = 0; i < data.length; i += 4) {
    if (Math.abs(data[i] - rgb[0]) < 30 && Math.abs(data[i + 1] - rgb[1]) < 30
        && Math.abs(data[i + 2] - rgb[2]) < 30 && data[i + 3] > 200) count += 1;
  }
  return count;
}"""


def test_trials_compared_on_one_chart_of_a_chosen_metric(
    page: Any, cluster: Cluster, screenshot_dir: Path
) -> None:
    experiment = cluster.submit(
        COMPARE_SCRIPT,
        unique("compare"),
        extra={
            "searcher": {"name": "grid"},
            "hyperparameters": {"lr": {"type": "categorical", "vals": [0.5, 1.0]}},
        },
    )

    def finished() -> list[int] | None:
        trials = cluster.master.api("GET", f"/api/v1/experiments/{experiment}/trials")["trials"]
        done = [t for t in trials if t["state"].removeprefix("STATE_") in TERMINAL]
        return sorted(t["id"] for t in trials) if len(done) == len(trials) == 2 else None

    first, second = cluster.master.wait_for("both trials to end", finished, WAIT_MS * 2 / 1000)
    page.goto(f"/ui/experiments/{experiment}")
    page.get_by_role("link", name="compare their metrics").click()
    page.wait_for_url(f"**/ui/experiments/{experiment}/compare")
    chart = page.locator(".chart[data-chart='compare']")
    assert chart.get_attribute("data-points") == "1"  # the default: validation loss
    assert page.get_by_label("Metric", exact=True).input_value() == "loss"

    page.get_by_label("Metrics", exact=True).select_option("training")
    page.get_by_role("button", name="Compare").click()
    page.wait_for_url(re.compile(r"group=training"))
    chart = page.locator(".chart[data-chart='compare']")
    assert chart.get_attribute("data-points") == "3"
    assert [t.strip() for t in chart.locator(".u-legend .u-series").all_inner_texts()] == [
        f"trial {first}",
        f"trial {second}",
    ]
    for rgb in ([47, 111, 171], [194, 65, 12]):  # the first two series' colours
        page.wait_for_function(
            f"([el, rgb]) => ({COLOUR_PIXELS})([el, rgb]) > 10",
            arg=[chart.element_handle(), rgb],
        )
    screenshot(page, screenshot_dir, "trials-compared")

    page.goto(f"/ui/experiments/{experiment}/compare?group=training&metric=nope&trial={first}")
    problem = page.get_by_role("alert").inner_text()
    assert "training metric named 'nope'" in problem and "They report: loss." in problem
    assert page.locator(".chart[data-chart='compare']").count() == 0


def bulk_trials(master: MasterProcess, experiment_id: int, reports: list[int]) -> list[int]:
    """Trials of the experiment with `reports[i]` validation reports each, written straight
    into the running master's database, numbered as the report path numbers them (100
    trials reporting through the API would take minutes). Trial i's loss is worse by
    i / 100, so the best trials are the first ones."""

    async def work() -> list[int]:
        engine = create_engine(async_database_url("", master.data_dir))
        try:
            async with session_scope(create_session_factory(engine)) as session:
                ids = list(
                    (
                        await session.scalars(
                            insert(TrialModel).returning(
                                TrialModel.id, sort_by_parameter_order=True
                            ),
                            [
                                {
                                    "experiment_id": experiment_id,
                                    "request_id": f"bulk-{i}",
                                    "state": "COMPLETED",
                                    "hparams": {"lr": 0.1},
                                    "seed": i,
                                    "run_id": 1,
                                    "total_batches_processed": count * 10,
                                }
                                for i, count in enumerate(reports)
                            ],
                        )
                    ).all()
                )
                rows = [
                    {
                        "trial_id": trial_id,
                        "group_name": "validation",
                        "steps_completed": (n + 1) * 10,
                        "trial_run_id": 1,
                        "metrics": {"validation_loss": 1 / (n + 1) + i / 100, "accuracy": 0.5},
                        "ordinal": n,
                        "thinning_level": thinning_level(n),
                    }
                    for i, (trial_id, count) in enumerate(zip(ids, reports, strict=True))
                    for n in range(count)
                ]
                await session.execute(insert(TrialMetricModel), rows)
            return ids
        finally:
            await engine.dispose()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, work()).result()


def test_a_hundred_trials_overlaid_thinned_with_a_note_best_n_and_a_readout(
    page: Any, browser: Any, cluster: Cluster, screenshot_dir: Path
) -> None:
    searcher = {"name": "single", "metric": "validation_loss"}
    experiment = paused_experiment(cluster, unique("hundred"), searcher)
    # The first trial reports 3,100 times: more than a trial may draw, so every 4th is.
    trials = bulk_trials(cluster.master, experiment, [3_100] + [120] * 99)
    query = "&".join(f"trial={t}" for t in trials)
    page.goto(f"/ui/experiments/{experiment}/compare?{query}")
    chart = page.locator(".chart[data-chart='compare']")
    page.wait_for_function("el => el.dataset.drawn === 'true'", arg=chart.element_handle())
    assert chart.get_attribute("data-series") == "100"
    legend = chart.locator(".u-legend .u-series")
    assert legend.count() == 100 and legend.nth(99).inner_text().strip() == f"trial {trials[-1]}"
    note = page.get_by_role("note")
    assert "Thinned to every 4th report" in note.inner_text()
    assert note.get_attribute("data-thinned") == "4"
    assert page.get_by_label(str(trials[50]), exact=True).is_checked()

    # Pointing at the lines reads a trial's value out.
    box = chart.locator("canvas").bounding_box()
    readout = page.locator("[data-compare-readout]")
    for x in (0.3, 0.5, 0.7):
        for y in (0.2, 0.4, 0.6, 0.8):
            page.mouse.move(box["x"] + box["width"] * x, box["y"] + box["height"] * y)
            if readout.get_attribute("data-trial"):
                break
        if readout.get_attribute("data-trial"):
            break
    assert re.match(r"trial \d+ · batch [\d,]+ · validation_loss \d", readout.inner_text())
    screenshot(page, screenshot_dir, "trials-compared-100")

    page.get_by_role("link", name="best 5", exact=True).click()
    page.wait_for_url(re.compile(r"best=5"))
    chart = page.locator(".chart[data-chart='compare']")
    page.wait_for_function("el => el.dataset.drawn === 'true'", arg=chart.element_handle())
    labels = [t.strip() for t in chart.locator(".u-legend .u-series").all_inner_texts()]
    assert labels == [f"trial {t}" for t in trials[:5]]  # best first
    assert page.get_by_role("note").count() == 1  # the long trial is among the best

    page.goto(f"/ui/experiments/{experiment}/compare?{query}&metric=nope")
    problem = page.get_by_role("alert").inner_text()
    assert "validation metric named 'nope'" in problem
    assert "They report: accuracy, validation_loss." in problem
    assert page.locator(".chart[data-chart='compare']").count() == 0
    screenshot(page, screenshot_dir, "trials-compared-unknown-metric")

    phone = browser.new_context(viewport=PHONE, base_url=cluster.master.url)
    console = ConsoleLog()
    small = phone.new_page()
    console.watch(small)
    sign_in(small)
    small.goto(f"/ui/experiments/{experiment}/compare?best=10")
    small.locator(".chart[data-chart='compare'][data-drawn]").wait_for()
    small.screenshot(path=str(screenshot_dir / "trials-compared-phone-390x844.png"), full_page=True)
    assert_fits_width(small, "the compare page at phone size")
    phone.close()
    assert not console.errors, "\n".join(console.errors)


# -- issue 28 part 5: the experiments list's columns and filters, and the tasks pages ------


def paused_experiment(
    cluster: Cluster, name: str, searcher: dict[str, Any], token: str | None = None, **extra: Any
) -> int:
    """An experiment that never takes the slot: created paused, through the API."""
    config = {
        "name": name,
        "entrypoint": "python3 train.py",
        "searcher": {"metric": "loss", "max_length": 1, **searcher},
        **extra,
    }
    body = {"config": json.dumps(config), "activate": False, "modelDefinition": []}
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    reply = cluster.master.http("POST", "/api/v1/experiments", json=body, headers=headers)
    assert reply.status_code == 200, reply.text
    experiment_id: int = reply.json()["experiment"]["id"]
    return experiment_id


def report_validation_loss(cluster: Cluster, experiment_id: int, loss: float, token: str) -> None:
    """A validation report for the experiment's first trial, as its ranks would send one."""
    trials = cluster.master.api("GET", f"/api/v1/experiments/{experiment_id}/trials")["trials"]
    trial = min(trials, key=lambda t: t["id"])
    body = {
        "group": "validation",
        "metrics": {
            "trialId": trial["id"],
            "trialRunId": 0,  # never run
            "stepsCompleted": 10,
            "metrics": {"avgMetrics": {"loss": loss}},
        },
    }
    reply = cluster.master.http(
        "POST",
        f"/api/v1/trials/{trial['id']}/metrics",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
    )
    assert reply.status_code == 200, reply.text


def shown_ids(page: Any) -> list[int]:
    ids = page.locator("#experiments-table tbody tr[data-experiment-id]").evaluate_all(
        "rows => rows.map(row => Number(row.dataset.experimentId))"
    )
    return list(ids)


def test_experiment_list_columns_sort_and_each_filter_narrows_it(
    page: Any, cluster: Cluster, screenshot_dir: Path
) -> None:
    # No digits in the names, so that searching for an id matches none of them by name.
    prefix = unique("listed").translate(str.maketrans("0123456789", "ghijklmnop"))
    mine = cluster.master.login()
    admin = cluster.master.login("admin")
    single = paused_experiment(cluster, f"{prefix}-single", {"name": "single"})
    grid = paused_experiment(
        cluster,
        f"{prefix}-grid",
        {"name": "grid"},
        hyperparameters={"lr": {"type": "categorical", "vals": [0.1, 0.2, 0.3]}},
        description="The Baseline",
        labels=[f"{prefix}-tag", "baseline"],
    )
    random = paused_experiment(
        cluster,
        f"{prefix}-random",
        {"name": "random", "max_trials": 2},
        token=admin,
        hyperparameters={"lr": {"type": "double", "minval": 0.1, "maxval": 0.2}},
    )
    report_validation_loss(cluster, single, 0.5, mine)
    report_validation_loss(cluster, grid, 0.25, mine)

    page.goto(f"/ui/experiments?text={prefix}")
    assert shown_ids(page) == [random, grid, single]  # newest first
    headers = page.locator("#experiments-table thead th").all_inner_texts()
    assert [h.split()[0] for h in headers[:7]] == [
        "ID",
        "Name",
        "Labels",
        "State",
        "Searcher",
        "Trials",
        "Best",
    ]
    row = page.locator(f"tr[data-experiment-id='{grid}']")
    assert row.locator("[data-col=searcher]").inner_text() == "grid"
    assert row.locator("[data-col=trials]").inner_text() == "3"
    assert row.locator("[data-col=best]").inner_text() == "loss 0.25"
    assert row.locator("[data-col=labels] .label").all_inner_texts() == [
        f"{prefix}-tag",
        "baseline",
    ]

    # Sorting: the best metric, smallest first, then largest; no value yet comes last.
    page.get_by_role("link", name="Best metric").click()
    page.wait_for_url(re.compile(r"sort=best"))
    assert shown_ids(page) == [grid, single, random]
    page.get_by_role("link", name=re.compile("^Best metric")).click()
    page.wait_for_url(re.compile(r"order=desc"))
    assert shown_ids(page) == [single, grid, random]
    page.get_by_role("link", name=re.compile("^Trials")).click()
    page.wait_for_url(re.compile(r"sort=trials"))
    assert shown_ids(page) == [grid, random, single]
    page.get_by_role("link", name=re.compile("^Searcher")).click()
    page.wait_for_url(re.compile(r"sort=searcher"))
    assert shown_ids(page) == [grid, random, single]

    # Each filter narrows the list, and they add up.
    filters = page.locator("form.filters")
    filters.locator("select[name=searcher]").select_option("single")
    filters.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"searcher=single"))
    assert shown_ids(page) == [single]
    filters.locator("select[name=searcher]").select_option("")
    filters.locator("select[name=user]").select_option("admin")
    filters.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"user=admin"))
    assert shown_ids(page) == [random]
    filters.locator("select[name=user]").select_option("")
    filters.locator("input[name=text]").fill("the baseline")  # the description, any case
    filters.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"text=the"))
    assert shown_ids(page) == [grid]
    filters.locator("input[name=text]").fill(str(single))  # an exact id
    filters.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(rf"text={single}"))
    # Other tests' experiments may hold these digits in their names; none of ours does.
    assert single in shown_ids(page) and not {grid, random} & set(shown_ids(page))
    filters.locator("input[name=text]").fill(prefix)
    filters.locator("input[name=label]").fill(f"{prefix}-tag")
    filters.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"label="))
    assert shown_ids(page) == [grid]
    filters.locator("input[name=label]").fill("")
    filters.locator("select[name=state]").select_option("PAUSED")
    filters.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"state=PAUSED"))
    assert sorted(shown_ids(page)) == sorted([single, grid, random])
    filters.locator("select[name=state]").select_option("ACTIVE")
    filters.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"state=ACTIVE"))
    assert shown_ids(page) == []
    assert "No experiments match these filters" in page.locator("#experiments-table").inner_text()
    # A label in the table is a link to the list filtered by it, the other filters kept.
    page.goto(f"/ui/experiments?text={prefix}&sort=best")
    screenshot(page, screenshot_dir, "experiments-columns")
    assert_fits_width(page, "the experiments list")
    page.locator(f"tr[data-experiment-id='{grid}'] a.label", has_text="baseline").click()
    page.wait_for_url(re.compile(r"label=baseline"))
    assert shown_ids(page) == [grid]
    assert page.locator("input[name=label]").input_value() == "baseline"


def command_state(cluster: Cluster, task_id: str) -> str:
    state: str = cluster.master.api("GET", f"/api/v1/commands/{task_id}")["command"]["state"]
    return state


def test_a_commands_logs_are_shown_and_kill_ends_it(
    page: Any, cluster: Cluster, screenshot_dir: Path
) -> None:
    body = {"config": {"entrypoint": "echo task-says-hello; sleep 600", "resources": {"slots": 0}}}
    task_id = cluster.master.api("POST", "/api/v1/commands", json=body)["command"]["id"]
    try:
        page.goto("/ui/tasks")
        row = page.locator(f"#interactive-tasks tr[data-task-id='{task_id}']")
        page.wait_for_function(
            f"() => document.querySelector(\"tr[data-task-id='{task_id}']\")"
            "?.dataset.state === 'RUNNING'",
            timeout=WAIT_MS,
        )
        cells = row.locator("td").all_inner_texts()
        assert cells[0] == "command" and cells[1] == task_id[:8] and cells[2] == "determined"
        assert "RUNNING" in cells[3]
        screenshot(page, screenshot_dir, "tasks-interactive")
        row.get_by_role("link", name="Logs").click()
        page.wait_for_url(f"**/ui/tasks/{task_id}#logs")
        logs = page.locator("pre[data-logs]")
        page.wait_for_function(
            "el => el.textContent.includes('task-says-hello')",
            arg=logs.element_handle(),
            timeout=WAIT_MS,
        )
        assert "echo task-says-hello" in page.locator("#task-live").inner_text()
        screenshot(page, screenshot_dir, "task-logs")

        dialogs: list[str] = []

        def accept(dialog: Any) -> None:
            dialogs.append(dialog.message)
            dialog.accept()

        page.once("dialog", accept)
        page.locator("#task-live").get_by_role("button", name="Kill").click()
        page.wait_for_url(f"**/ui/tasks/{task_id}?notice=killed")
        assert dialogs and f"Kill command {task_id[:8]}" in dialogs[0]
        page.wait_for_function(
            "() => document.querySelector('#task-live').dataset.state === 'TERMINATED'",
            timeout=WAIT_MS,
        )
        assert "killed by determined" in page.locator("#task-reason").inner_text()
        page.wait_for_function(
            "() => document.querySelector('[data-log-status]').textContent"
            ".includes('The command has ended')",
            timeout=WAIT_MS,
        )
        assert page.get_by_role("button", name="Kill").count() == 0
        assert command_state(cluster, task_id) == "STATE_TERMINATED"
    finally:
        cluster.master.http("POST", f"/api/v1/commands/{task_id}/kill")


def test_another_users_task_cannot_be_killed_and_unknown_tasks_are_not_found(
    browser: Any, cluster: Cluster, screenshot_dir: Path
) -> None:
    admin = cluster.master.login("admin")
    body = {"config": {"entrypoint": "sleep 600", "resources": {"slots": 0}}}
    reply = cluster.master.http(
        "POST", "/api/v1/commands", json=body, headers={"Authorization": f"Bearer {admin}"}
    )
    assert reply.status_code == 200, reply.text
    task_id = reply.json()["command"]["id"]
    # Its own context: the console reports the 403 and 404 loads, which are the point here.
    context = browser.new_context(viewport=DESKTOP, base_url=cluster.master.url)
    try:
        page = context.new_page()
        sign_in(page)
        page.goto(f"/ui/tasks/{task_id}")
        assert "admin" in page.locator("#task-live").inner_text()
        page.once("dialog", lambda dialog: dialog.accept())
        with page.expect_navigation() as navigation:
            page.locator("#task-live").get_by_role("button", name="Kill").click()
        assert navigation.value.status == 403
        banner = page.get_by_role("alert").inner_text()
        assert "belongs to admin; only its owner or an admin may kill it" in banner
        screenshot(page, screenshot_dir, "task-kill-refused")
        task = cluster.master.api("GET", f"/api/v1/commands/{task_id}")["command"]
        assert task["state"] != "STATE_TERMINATED" and not task["endReason"]

        reply = page.goto("/ui/tasks/no-such-task")
        assert reply.status == 404
        assert "task no-such-task not found" in page.locator("main").inner_text()
        nav = page.locator("header.top nav").get_by_role("link").all_inner_texts()
        assert nav == ["Cluster", "Workspaces", "Experiments", "Tasks", "Templates", "Models"]
    finally:
        context.close()
        cluster.master.http(
            "POST", f"/api/v1/commands/{task_id}/kill", headers={"Authorization": f"Bearer {admin}"}
        )
