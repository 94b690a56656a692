"""What a search found, in the real browser: a small ASHA search runs on a real agent, then
its hyperparameter scatters and its rungs picture are opened in Debian's Chromium through
the experiment page's links, and checked as a user sees them (points drawn inside the
plots, the best one marked and named, stopped trials marked stopped). Screenshots go to the
folder the suite prints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import unique
from tests.web.conftest import ConsoleLog
from tests.web.test_browser import (  # noqa: F401 - the fixtures, for a cluster of this file
    DESKTOP,
    PHONE,
    TERMINAL,
    WAIT_MS,
    Cluster,
    assert_fits_width,
    cluster,
    page,
    screenshot,
    sign_in,
)

pytestmark = pytest.mark.e2e

# The loss falls with lr and width; validations every 2 batches, and the searcher's stop
# is heard at once (should_preempt after each validation).
ASHA_SCRIPT = """\
import resolute

with resolute.init() as ctx:
    lr, width = ctx.hparams["lr"], ctx.hparams["model"]["width"]
    for step in range(1, (ctx.max_length or 4) + 1):
        loss = 1 / (1 + 10 * lr * step) + 1 / width
        ctx.train.report_training_metrics(steps_completed=step, metrics={"loss": loss})
        if step % 2 == 0:
            ctx.train.report_validation_metrics(steps_completed=step, metrics={"loss": loss})
            if ctx.preempt.should_preempt():
                break
"""

ASHA_CONFIG: dict[str, Any] = {
    "hyperparameters": {
        "lr": {"type": "log", "base": 10, "minval": -3, "maxval": 0},
        "optimizer": {"type": "categorical", "vals": ["adam", "sgd"]},
        "model": {"width": {"type": "int", "minval": 4, "maxval": 64}},
        "global_batch_size": 32,
    },
    "searcher": {
        "name": "async_halving",
        "metric": "loss",
        "num_rungs": 2,
        "divisor": 2,
        "max_time": 4,
        "time_metric": "batches",
        "max_trials": 5,
        "max_concurrent_trials": 1,
    },
    "reproducibility": {"experiment_seed": 11},
}


def best_loss(trial: dict[str, Any]) -> float | None:
    best = trial.get("bestValidation")
    value = best["metrics"]["avgMetrics"].get("loss") if best else None
    return float(value) if value is not None else None


@pytest.fixture(scope="module")
def search(cluster: Cluster) -> tuple[int, list[dict[str, Any]]]:  # noqa: F811
    """A finished ASHA search: its id and its trials as the API shows them."""
    experiment = cluster.submit(ASHA_SCRIPT, unique("asha-pictures"), extra=ASHA_CONFIG)

    def finished() -> list[dict[str, Any]] | None:
        state = cluster.master.api("GET", f"/api/v1/experiments/{experiment}")["experiment"]
        if state["state"].removeprefix("STATE_") not in TERMINAL:
            return None
        trials: list[dict[str, Any]] = cluster.master.api(
            "GET", f"/api/v1/experiments/{experiment}/trials"
        )["trials"]
        return trials

    trials = cluster.master.wait_for("the search to end", finished, WAIT_MS * 3 / 1000)
    # What the pictures must show: some trials stopped, one trained the full length.
    stopped = [t for t in trials if t["searcher"]["stoppedAtRung"] is not None]
    assert any(t["searcher"]["reachedTop"] for t in trials), trials
    assert any(not t["searcher"]["reachedTop"] for t in stopped), trials
    return experiment, trials


# A point's circle: drawn inside its plot, and the colour it is filled with.
POINTS = """svg => Array.from(svg.querySelectorAll('a.point')).map(a => {
  const box = a.querySelector('circle').getBoundingClientRect();
  const plot = svg.getBoundingClientRect();
  return {
    trial: Number(a.dataset.trialId),
    best: a.classList.contains('best'),
    inside: box.width > 4 && box.left >= plot.left && box.right <= plot.right
      && box.top >= plot.top && box.bottom <= plot.bottom,
    fill: getComputedStyle(a.querySelector('circle')).fill,
  };
})"""


def test_hyperparameters_are_drawn_against_the_metric_with_the_best_trial_marked(
    page: Any,  # noqa: F811
    search: tuple[int, list[dict[str, Any]]],
    screenshot_dir: Path,
) -> None:
    experiment, trials = search
    scored = {t["id"]: best_loss(t) for t in trials if best_loss(t) is not None}
    best = min(scored, key=lambda t: (scored[t], t))
    page.goto(f"/ui/experiments/{experiment}")
    page.get_by_role("link", name="Hyperparameters against loss").click()
    page.wait_for_url(f"**/ui/experiments/{experiment}/hyperparameters")

    figures = page.locator("figure.scatter")
    assert figures.evaluate_all("fs => fs.map(f => f.dataset.hparam)") == [
        "lr",
        "model.width",
        "optimizer",
    ]
    for name in ("lr", "model.width", "optimizer"):
        svg = page.locator(f"figure.scatter[data-hparam='{name}'] svg")
        points = svg.evaluate(POINTS)
        assert sorted(p["trial"] for p in points) == sorted(scored), name
        assert all(p["inside"] for p in points), (name, points)
        [marked] = [p for p in points if p["best"]]
        assert marked["trial"] == best, name
        others = {p["fill"] for p in points if not p["best"]}
        assert others and marked["fill"] not in others, (name, points)  # a colour of its own
        label = svg.locator("text.best-label")
        assert label.is_visible() and label.text_content() == f"best: trial {best}"
    lr_ticks = page.locator("figure.scatter[data-hparam='lr'] text.tick.x").all_text_contents()
    assert lr_ticks == ["0.001", "0.01", "0.1", "1"]  # a log axis, by decades
    titles = page.locator("figure.scatter[data-hparam='lr'] text.title").all_text_contents()
    assert titles == ["lr (log scale, base 10)", "best loss (smaller is better)"]
    lines = page.locator("figure.parallel a.line")
    assert sorted(int(t) for t in lines.evaluate_all("ls => ls.map(l => l.dataset.trialId)")) == (
        sorted(scored)
    )
    assert page.locator("figure.parallel a.line.best").get_attribute("data-trial-id") == str(best)
    assert page.locator("figure.parallel text.best-label").text_content() == f"best: trial {best}"
    assert page.locator("#constants [data-constant='global_batch_size']").is_visible()
    assert page.locator("[data-best-trial]").get_attribute("data-best-trial") == str(best)
    screenshot(page, screenshot_dir, "hyperparameters")

    page.locator("figure.scatter[data-hparam='lr'] a.point.best").click()
    page.wait_for_url(f"**/ui/trials/{best}")


# Each rung card: where it is, what it says, and the colour of its left edge.
CARDS = """() => Array.from(document.querySelectorAll('.rung-card[data-trial-id]')).map(c => ({
  trial: Number(c.dataset.trialId),
  rung: Number(c.closest('.rung-column').dataset.rung),
  status: c.dataset.status,
  text: c.innerText.replace(/\\s+/g, ' ').trim(),
  edge: getComputedStyle(c).borderLeftColor,
  visible: c.getBoundingClientRect().width > 0,
}))"""


def test_the_rungs_picture_shows_where_each_trial_got_and_which_were_stopped(
    browser: Any,
    page: Any,  # noqa: F811
    cluster: Cluster,  # noqa: F811
    search: tuple[int, list[dict[str, Any]]],
    screenshot_dir: Path,
) -> None:
    experiment, trials = search
    page.goto(f"/ui/experiments/{experiment}")
    page.get_by_role("link", name="ASHA rungs").click()
    page.wait_for_url(f"**/ui/experiments/{experiment}/rungs")
    headings = page.locator(".rung-column h3").all_inner_texts()
    assert [h.split(" (")[0] for h in headings] == ["rung 0", "rung 1"]
    assert "rung 0 (2 batches)" in headings[0] and "rung 1 (4 batches)" in headings[1]

    cards = {c["trial"]: c for c in page.evaluate(CARDS)}
    assert sorted(cards) == sorted(t["id"] for t in trials)
    edges: dict[str, set[str]] = {}
    for trial in trials:
        found, card = trial["searcher"], cards[trial["id"]]
        assert card["visible"] and card["rung"] == found["rung"], (trial["id"], card)
        if found["reachedTop"]:
            assert card["status"] == "top" and "★ trained the full 4 batches" in card["text"]
        elif found["stoppedAtRung"] is not None:
            assert card["status"] == "stopped", card
            assert f"✕ stopped at rung {found['stoppedAtRung']}" in card["text"]
        metric = found["rungs"][-1]["metric"]
        assert f"{metric:.6g}" in card["text"], card
        edges.setdefault(card["status"], set()).add(card["edge"])
    # Stopped and full-length trials look different at a glance: red and green edges.
    assert edges["stopped"] == {"rgb(198, 40, 40)"} and edges["top"] == {"rgb(26, 127, 55)"}
    screenshot(page, screenshot_dir, "asha-rungs")

    context = browser.new_context(viewport=PHONE, base_url=cluster.master.url)
    console = ConsoleLog()
    phone = context.new_page()
    console.watch(phone)
    sign_in(phone)
    for path, name in (("rungs", "asha-rungs"), ("hyperparameters", "hyperparameters")):
        phone.goto(f"/ui/experiments/{experiment}/{path}")
        phone.screenshot(path=str(screenshot_dir / f"{name}-phone-390x844.png"), full_page=True)
        assert_fits_width(phone, f"the {path} page at phone size")
    context.close()
    assert not console.errors, "\n".join(console.errors)


def test_a_search_without_rungs_says_so_and_keeps_the_navigation(
    browser: Any,
    cluster: Cluster,  # noqa: F811
    screenshot_dir: Path,
) -> None:
    # Its own context: the console reports every 4xx page load, which is the point here.
    context = browser.new_context(viewport=DESKTOP, base_url=cluster.master.url)
    page_ = context.new_page()
    sign_in(page_)
    experiment = cluster.master.api(
        "POST",
        "/api/v1/experiments",
        json={
            "config": "name: plain\nentrypoint: python3 train.py\n"
            "searcher: {name: single, metric: loss, max_length: 1}\n",
            "activate": False,
            "modelDefinition": [],
        },
    )["experiment"]["id"]
    reply = page_.goto(f"/ui/experiments/{experiment}/rungs")
    assert reply.status == 400
    assert "uses the single searcher" in page_.locator("main").inner_text()
    nav = page_.locator("header.top nav").get_by_role("link").all_inner_texts()
    assert nav == ["Cluster", "Workspaces", "Experiments", "Tasks", "Templates", "Models"]
    screenshot(page_, screenshot_dir, "rungs-refused")
    # No metric reported: the hyperparameter page says so instead of drawing empty plots.
    page_.goto(f"/ui/experiments/{experiment}/hyperparameters")
    assert page_.locator("[data-hp-empty]").is_visible()
    context.close()
