"""What a search found, in-process on both databases: the hyperparameter scatters and their
JSON feed, and an ASHA search's rungs picture, built from reports sent through the API as
trials send them; and the clean refusals of ids and searchers that have no such picture."""

from __future__ import annotations

import html
import re
from typing import Any

import httpx
from fastapi import FastAPI

from tests.api.test_agent_link import hub_of
from tests.api.test_asha_search import (
    connect_agent,
    current_run,
    start_queued,
    submit,
    trials_of,
    validate,
)
from tests.web.test_pages import bearer

SEARCH_YAML = """\
name: hp-search
entrypoint: python3 train.py
hyperparameters:
  global_batch_size: 64
  lr: {type: log, base: 10, minval: -4, maxval: -1}
  layers: {type: int, minval: 1, maxval: 4}
  optimizer: {type: categorical, vals: [adam, sgd]}
  model:
    width: {type: int, minval: 8, maxval: 64}
    activation: {type: const, val: relu}
searcher: {name: random, metric: validation_loss, max_trials: 4, max_length: {batches: 100}}
reproducibility: {experiment_seed: 5}
"""


async def report(client: httpx.AsyncClient, trial_id: int, steps: int, value: Any) -> None:
    """A validation report, as the trial's ranks send one."""
    body = {
        "group": "validation",
        "metrics": {
            "trialId": trial_id,
            "trialRunId": await current_run(client, trial_id),
            "stepsCompleted": steps,
            "metrics": {"avgMetrics": {"validation_loss": value}},
        },
    }
    reply = await client.post(f"/api/v1/trials/{trial_id}/metrics", json=body)
    assert reply.status_code == 200, reply.text


def text_of(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def figures(page: str) -> dict[str, str]:
    """Each scatter plot's markup by its hyperparameter."""
    return dict(
        re.findall(r'<figure class="scatter" data-hparam="([^"]+)".*?>(.*?)</figure>', page, re.S)
    )


def plotted(figure: str) -> dict[int, str]:
    """Trial id -> the point's class, for each point of one plot."""
    points = re.findall(r'<a href="/ui/trials/(\d+)" class="(point[^"]*)"', figure)
    return {int(trial): cls for trial, cls in points}


async def test_hyperparameters_are_plotted_against_each_trials_best_metric(
    web: httpx.AsyncClient,
) -> None:
    await bearer(web)
    reply = await web.post("/api/v1/experiments", json={"config": SEARCH_YAML, "activate": True})
    assert reply.status_code == 200, reply.text
    experiment_id = reply.json()["experiment"]["id"]
    trials = await trials_of(web, experiment_id)
    first, second, third, fourth = (t["id"] for t in trials)
    url = f"/ui/experiments/{experiment_id}/hyperparameters"

    # Nothing reported yet: a clear empty state, every trial listed as without a metric.
    empty = await web.get(url)
    assert empty.status_code == 200
    assert "No trial has reported validation_loss yet" in empty.text
    assert figures(empty.text) == {}
    for trial in (first, second, third, fourth):
        assert f'<li data-trial-id="{trial}"><a href="/ui/trials/{trial}">' in empty.text
    feed = (await web.get(f"{url}.json")).json()
    assert feed["bestTrialId"] is None and {t["metric"] for t in feed["trials"]} == {None}

    await report(web, first, 10, 0.9)
    await report(web, first, 20, 0.4)  # its best, not its latest, counts
    await report(web, first, 30, 0.6)
    await report(web, second, 10, 0.7)
    await report(web, third, 10, "NaN")  # no finite value: still without a metric
    page = await web.get(url)
    assert page.status_code == 200
    shown = figures(page.text)
    # Searched ones are plotted, nested ones by their path; constants are listed instead.
    assert list(shown) == ["layers", "lr", "model.width", "optimizer"]
    for name, figure in shown.items():
        assert plotted(figure) == {second: "point", first: "point best"}, name
        assert f"best: trial {first}" in text_of(figure)
        assert "best validation_loss (smaller is better)" in text_of(figure)
    assert "lr (log scale, base 10)" in text_of(shown["lr"])
    assert "optimizer (categorical)" in text_of(shown["optimizer"])
    assert re.search(r">adam</text>.*>sgd</text>", shown["optimizer"], re.S)
    banner = re.search(r'<p class="best-trial" data-best-trial="(\d+)">(.*?)</p>', page.text, re.S)
    assert banner and int(banner.group(1)) == first
    said = text_of(banner.group(2))
    assert said.startswith(f"Best trial: trial {first}") and "validation_loss 0.4 ·" in said
    # All of them at once: one line per trial with a metric, the best one marked.
    parallel = re.search(
        r'<figure class="parallel" data-lines="(\d+)">(.*?)</figure>', page.text, re.S
    )
    assert parallel and parallel.group(1) == "2"
    lines = re.findall(r'<a href="/ui/trials/(\d+)" class="(line[^"]*)"', parallel.group(2))
    assert {int(t): c for t, c in lines} == {second: "line", first: "line best"}
    assert f"best: trial {first}" in text_of(parallel.group(2))
    no_metric = re.search(r'<section id="no-metric">(.*?)</section>', page.text, re.S)
    assert no_metric
    assert f"trial {third}" in text_of(no_metric.group(1))
    assert f"trial {fourth}" in text_of(no_metric.group(1))
    assert f"trial {first}" not in text_of(no_metric.group(1))
    constants = re.search(r'<section id="constants">(.*?)</section>', page.text, re.S)
    assert constants
    assert 'data-constant="global_batch_size"' in constants.group(1)
    assert 'data-constant="model.activation"' in constants.group(1)
    assert "relu" in text_of(constants.group(1))

    # The feed: the values the API shows, and each trial's best metric.
    feed = (await web.get(f"{url}.json")).json()
    assert feed["metric"] == "validation_loss" and feed["smallerIsBetter"] is True
    assert feed["bestTrialId"] == first
    kinds = {h["name"]: h for h in feed["hyperparameters"]}
    assert list(kinds) == ["layers", "lr", "model.width", "optimizer"]
    assert kinds["lr"]["type"] == "log" and kinds["lr"]["base"] == 10
    assert kinds["optimizer"]["categories"] == ["adam", "sgd"]
    by_id = {t["id"]: t for t in feed["trials"]}
    assert [by_id[t]["metric"] for t in (first, second, third, fourth)] == [0.4, 0.7, None, None]
    for trial in trials:
        hparams = trial["hparams"]
        values = by_id[trial["id"]]["values"]
        assert values["lr"] == hparams["lr"] and values["layers"] == hparams["layers"]
        assert values["model.width"] == hparams["model"]["width"]

    # The experiment page links here.
    experiment_page = await web.get(f"/ui/experiments/{experiment_id}")
    assert f'href="{url}"' in experiment_page.text
    assert f'href="/ui/experiments/{experiment_id}/rungs"' not in experiment_page.text


async def test_a_larger_is_better_metric_marks_the_largest(web: httpx.AsyncClient) -> None:
    await bearer(web)
    config = SEARCH_YAML.replace("max_trials: 4,", "max_trials: 2, smaller_is_better: false,")
    assert config != SEARCH_YAML
    reply = await web.post("/api/v1/experiments", json={"config": config, "activate": True})
    assert reply.status_code == 200, reply.text
    experiment_id = reply.json()["experiment"]["id"]
    first, second = (t["id"] for t in await trials_of(web, experiment_id))
    await report(web, first, 10, 0.9)
    await report(web, second, 10, 0.95)
    page = await web.get(f"/ui/experiments/{experiment_id}/hyperparameters")
    lr = figures(page.text)["lr"]
    assert plotted(lr) == {first: "point", second: "point best"}
    assert "best validation_loss (larger is better)" in text_of(lr)
    assert f'data-best-trial="{second}"' in page.text


def rung_cards(page: str) -> dict[int, tuple[int, str, str]]:
    """Trial id -> (the rung column it is in, its status, its card's text)."""
    cards: dict[int, tuple[int, str, str]] = {}
    for rung, column in re.findall(
        r'<div class="rung-column[^"]*" data-rung="(-?\d+)">(.*?)</ol>', page, re.S
    ):
        for trial, status, body in re.findall(
            r'<li class="rung-card [a-z]+" data-trial-id="(\d+)" data-status="([a-z]+)"'
            r"[^>]*>(.*?)</li>",
            column,
            re.S,
        ):
            cards[int(trial)] = (int(rung), status, text_of(body))
    return cards


async def test_the_rungs_picture_places_each_trial_and_marks_the_stopped_ones(
    web: httpx.AsyncClient, app: FastAPI
) -> None:
    await bearer(web)
    hub = hub_of(app)
    agent = await connect_agent(hub)
    experiment_id = await submit(web)  # async_halving: 2 rungs at 2 and 4 batches, divisor 2
    url = f"/ui/experiments/{experiment_id}/rungs"
    waiting = await web.get(url)
    assert waiting.status_code == 200
    first, second = await trials_of(web, experiment_id)
    cards = rung_cards(waiting.text)
    assert cards[first["id"]][:2] == cards[second["id"]][:2] == (-1, "waiting")
    assert "before rung 0 (2 batches)" in text_of(waiting.text)
    assert 'hx-trigger="every 2s"' in waiting.text  # refreshed while the search runs

    assert await start_queued(app, hub, agent)
    await validate(web, first, {"loss": 1.0, "batches": 2})
    await validate(web, second, {"loss": 2.0, "batches": 2})  # the worse half: stopped
    await validate(web, first, {"loss": 0.5, "batches": 4})  # the top rung: full length
    first, second = await trials_of(web, experiment_id)
    assert second["searcher"]["stoppedAtRung"] == 0 and not second["searcher"]["reachedTop"]
    assert first["searcher"]["reachedTop"]

    page = await web.get(url)
    for shown in (page.text, (await web.get(url, headers={"HX-Request": "true"})).text):
        cards = rung_cards(shown)
        assert cards[second["id"]] == (
            0,
            "stopped",
            f"trial {second['id']} 2 \u2715 stopped at rung 0",
        )
        assert cards[first["id"]] == (
            1,
            "top",
            f"trial {first['id']} 0.5 \u2605 trained the full 4 batches",
        )
    assert "rung 0 (2 batches)" in text_of(page.text) and "rung 1 (4 batches)" in text_of(page.text)
    partial = await web.get(url, headers={"HX-Request": "true"})
    assert partial.text.startswith('<div id="rungs-live"')
    experiment_page = await web.get(f"/ui/experiments/{experiment_id}")
    assert f'href="{url}"' in experiment_page.text


async def test_an_adaptive_search_shows_each_bracket(web: httpx.AsyncClient) -> None:
    await bearer(web)
    config = """\
name: brackets
entrypoint: python3 train.py
hyperparameters: {lr: {type: double, minval: 0.001, maxval: 0.1}}
searcher:
  name: adaptive_asha
  metric: loss
  time_metric: batches
  max_time: 64
  max_trials: 8
  max_rungs: 3
"""
    experiment_id = await submit(web, config)
    page = await web.get(f"/ui/experiments/{experiment_id}/rungs")
    assert page.status_code == 200
    brackets = re.findall(r'<section class="bracket" data-bracket="(\d+)">', page.text)
    assert len(brackets) > 1 and brackets == [str(i) for i in range(len(brackets))]
    for index in brackets:
        assert f"Bracket {index}" in page.text
    trials = await trials_of(web, experiment_id)
    cards = rung_cards(page.text)
    assert sorted(cards) == sorted(t["id"] for t in trials)
    for trial in trials:  # each in its own bracket's section, none reported yet
        section = re.search(
            rf'data-bracket="{trial["searcher"]["bracket"]}">(.*?)</section>', page.text, re.S
        )
        assert section and f'data-trial-id="{trial["id"]}"' in section.group(1)
        assert cards[trial["id"]][:2] == (-1, "waiting")


async def test_unknown_experiments_and_other_searchers_get_a_clear_page(
    web: httpx.AsyncClient, app: FastAPI
) -> None:
    await bearer(web)
    reply = await web.post("/api/v1/experiments", json={"config": SEARCH_YAML, "activate": True})
    random_id = reply.json()["experiment"]["id"]
    for path, status, says in (
        ("/ui/experiments/987654/hyperparameters", 404, "experiment 987654 not found"),
        ("/ui/experiments/987654/rungs", 404, "experiment 987654 not found"),
        ("/ui/experiments/abc/rungs", 400, "experiment_id"),
        ("/ui/experiments/-1/hyperparameters", 400, "experiment_id"),
        (
            f"/ui/experiments/{random_id}/rungs",
            400,
            f"experiment {random_id} uses the random searcher: only adaptive_asha and "
            "async_halving searches have rungs",
        ),
    ):
        page = await web.get(path)
        assert page.status_code == status, (path, page.status_code, page.text[-300:])
        assert page.headers["content-type"].startswith("text/html")
        assert says in html.unescape(page.text), path
        assert 'class="problem"' in page.text and 'href="/ui/experiments"' in page.text, path
    feed = await web.get("/ui/experiments/987654/hyperparameters.json")
    assert feed.status_code == 404 and feed.json()["code"] == 5
    # Signed out: the sign-in form, never the data.
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://master") as stranger:
        page = await stranger.get(f"/ui/experiments/{random_id}/hyperparameters")
        assert page.status_code == 303 and page.headers["location"].startswith("/ui/login")
        feed = await stranger.get(f"/ui/experiments/{random_id}/hyperparameters.json")
        assert feed.status_code == 401
