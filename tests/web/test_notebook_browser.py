"""A notebook in a real browser (Debian's Chromium, driven by Playwright): signed in on the
dashboard, opened through the master's proxy, a cell run on the agent and its output read."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import AgentProcess, wait_until
from tests.conftest import require
from tests.e2e.conftest import MasterProcess, describe_run

DESKTOP = {"width": 1280, "height": 800}


@pytest.fixture(scope="module")
def notebook_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterProcess]:
    require(
        importlib.util.find_spec("jupyterlab") is not None,
        "jupyterlab is not installed (make install puts it in .venv)",
    )
    work = tmp_path_factory.mktemp("notebook-web")
    master = MasterProcess(work / "data", label="notebook-web")
    master.start()
    agent = AgentProcess(master, "notebook-agent", work / "agent", slots=1).start()
    try:
        agent.wait_connected()
        yield master
    finally:
        agent.stop()
        master.stop()


def test_a_notebook_opened_through_the_proxy_runs_a_cell_on_the_agent(
    browser: Any, notebook_cluster: MasterProcess, screenshot_dir: Path
) -> None:
    master = notebook_cluster
    started = master.det("notebook", "start", "--no-browser", timeout=180)
    assert started.returncode == 0, describe_run(started)
    url = started.stdout.strip().rsplit(" ", 1)[-1]
    path = url.removeprefix(master.url)
    notebook_id = path.rstrip("/").rsplit("/", 1)[-1]
    context = browser.new_context(viewport=DESKTOP, base_url=master.url)
    context.set_default_timeout(60_000)
    page = context.new_page()
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    try:
        # Signed out, the proxy sends the browser to sign in, and back.
        page.goto(path + "lab")
        page.wait_for_url("**/ui/login**")
        page.get_by_label("Username").fill("determined")
        page.get_by_label("Password").fill("")
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(f"**{path}lab**")
        # As a user finds it again: the Tasks page lists it, running, with Open.
        page.goto("/ui/tasks")
        row = page.locator(f'tr[data-task-id="{notebook_id}"]')
        row.get_by_role("link", name="Open").click()
        page.wait_for_url(f"**{path}lab**")
        # JupyterLab's launcher: a new Python notebook. Its kernel starts on the agent and
        # the page connects to it through the proxy; on a loaded machine either takes a
        # while, so wait for both where Jupyter itself says so before typing a key.
        launcher = page.locator(".jp-LauncherCard[title*='Python 3']").first
        launcher.wait_for()
        page.screenshot(path=str(screenshot_dir / "notebook-opened-from-tasks.png"))
        launcher.click()
        kernel = wait_until(
            "the notebook's kernel to be idle with the page connected to it",
            lambda: _connected_idle_kernel(page, path),
            timeout=180,
            interval=0.5,
        )
        cell = page.locator(".jp-Notebook .jp-Cell .cm-content").first
        code = (
            "import os; print('ran', os.environ['DET_TASK_TYPE'], 6 * 7, "
            "os.environ['DET_AGENT_ID'])"
        )
        # The editor may not take keys for a moment after the notebook opens: type until
        # the cell holds the code.
        for _ in range(10):
            cell.click()
            page.keyboard.press("Control+A")
            page.keyboard.type(code)
            if "DET_AGENT_ID" in cell.inner_text():
                break
            page.wait_for_timeout(1000)
        assert "DET_AGENT_ID" in cell.inner_text(), f"the cell holds {cell.inner_text()!r}"
        page.keyboard.press("Shift+Enter")
        output = page.locator(".jp-OutputArea-output").first
        output.wait_for(timeout=180_000)
        text = output.inner_text()
        assert "ran NOTEBOOK 42 notebook-agent" in text, text
    except Exception:
        page.screenshot(path=str(screenshot_dir / "notebook-failure.png"))
        print("\n".join(console[-30:]))
        print(master.det("notebook", "logs", notebook_id).stdout[-4000:])
        print(master.output(tail=4000))
        raise
    finally:
        context.close()
        master.det("notebook", "kill", notebook_id)
    assert kernel["name"].startswith("python")


def _connected_idle_kernel(page: Any, path: str) -> dict[str, Any] | None:
    """The notebook's kernel as Jupyter's REST API reports it through the proxy (the page's
    session cookie signs the request in), once it is idle and the page holds a connection."""
    reply = page.request.get(f"{path}api/kernels")
    if not reply.ok:
        return None
    for kernel in reply.json():
        if kernel.get("execution_state") == "idle" and kernel.get("connections", 0) >= 1:
            return dict(kernel)
    return None
