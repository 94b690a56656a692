"""Experiment labels (issue 32): from the config at submit, Determined's PatchExperiment
(what `det experiment label add|remove` sends), the SDK's PUT/DELETE of one label, the list
of labels in use, the list filter, and every bad input refused with nothing changed."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import update

from master.db.models import ExperimentModel
from master.db.session import session_scope
from tests.api.test_access import alice, refusal  # noqa: F401 - alice is a fixture
from tests.factories import EXPERIMENT_YAML, create_experiment

SINGLE = """\
name: labelled
entrypoint: python3 train.py
searcher: {name: single, metric: loss, max_length: {batches: 10}}
"""


async def new_experiment(api: httpx.AsyncClient, config: str = SINGLE) -> dict[str, Any]:
    reply = await create_experiment(api, config)
    assert reply.status_code == 200, reply.text
    experiment: dict[str, Any] = reply.json()["experiment"]
    return experiment


async def experiment_of(api: httpx.AsyncClient, experiment_id: int) -> dict[str, Any]:
    reply = await api.get(f"/api/v1/experiments/{experiment_id}")
    assert reply.status_code == 200, reply.text
    experiment: dict[str, Any] = reply.json()["experiment"]
    return experiment


def as_official_client_patches(experiment: dict[str, Any], labels: list[str]) -> dict[str, Any]:
    """The body `det experiment label add|remove` sends: v1PatchExperiment built from the
    experiment it read (id, description, labels, name, notes), its labels changed."""
    return {
        "id": experiment["id"],
        "description": experiment["description"],
        "labels": labels,
        "name": experiment["name"],
        "notes": experiment["notes"],
    }


async def test_config_labels_are_kept_in_order_once(api: httpx.AsyncClient) -> None:
    config = SINGLE + "labels: [vision, baseline, vision, 'two words']\n"
    experiment = await new_experiment(api, config)
    assert experiment["labels"] == ["vision", "baseline", "two words"]
    assert experiment["config"]["labels"] == ["vision", "baseline", "two words"]
    assert (await experiment_of(api, experiment["id"]))["labels"] == experiment["labels"]
    unlabelled = await new_experiment(api)
    assert unlabelled["labels"] == []


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ("[ok, '']", "labels[1]: the label is empty"),
        ("['   ']", "labels[0]: the label is only spaces"),
        (f"['{'x' * 256}']", "labels[0]: the label is 256 characters long; at most 255"),
        ('["tab\\there"]', "labels[0]: the label holds a control character (U+0009)"),
        (f"[{', '.join(f'l{i}' for i in range(101))}]", "labels: 101 labels; an experiment may"),
        ("[1, 2]", "labels.0"),  # the config's own check: a list of strings
        ("vision", "labels"),
    ],
)
async def test_bad_config_labels_are_refused(
    api: httpx.AsyncClient, labels: str, message: str
) -> None:
    before = (await api.get("/api/v1/experiments")).json()["pagination"]["total"]
    reply = await create_experiment(api, SINGLE + f"labels: {labels}\n")
    assert message in refusal(reply, 400)
    assert (await api.get("/api/v1/experiments")).json()["pagination"]["total"] == before


async def test_the_official_clients_patch_adds_and_removes(api: httpx.AsyncClient) -> None:
    experiment = await new_experiment(api, SINGLE + "description: first try\n")
    path = f"/api/v1/experiments/{experiment['id']}"
    reply = await api.patch(path, json=as_official_client_patches(experiment, ["a", "b/c"]))
    assert reply.status_code == 200, reply.text
    patched = reply.json()["experiment"]
    assert patched["labels"] == ["a", "b/c"]
    assert patched["name"] == "labelled" and patched["description"] == "first try"
    stored = await experiment_of(api, experiment["id"])
    assert stored["labels"] == ["a", "b/c"] and stored["config"]["labels"] == ["a", "b/c"]
    reply = await api.patch(path, json=as_official_client_patches(stored, ["b/c"]))
    assert reply.json()["experiment"]["labels"] == ["b/c"]
    # The SDK's set_labels sends only the id and the labels.
    reply = await api.patch(path, json={"id": experiment["id"], "labels": []})
    assert reply.json()["experiment"]["labels"] == []


async def test_patch_renames_and_describes(api: httpx.AsyncClient) -> None:
    experiment = await new_experiment(api)
    path = f"/api/v1/experiments/{experiment['id']}"
    reply = await api.patch(path, json={"name": "renamed", "description": "why"})
    assert reply.status_code == 200, reply.text
    stored = await experiment_of(api, experiment["id"])
    assert (stored["name"], stored["description"]) == ("renamed", "why")
    assert (stored["config"]["name"], stored["config"]["description"]) == ("renamed", "why")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"labels": ["ok", ""]}, "labels[1]: the label is empty"),
        ({"labels": ["x" * 256]}, "labels[0]: the label is 256 characters long; at most 255"),
        ({"labels": ["new\nline"]}, "labels[0]: the label holds a control character (U+000A)"),
        ({"labels": ["nul\x00"]}, "labels[0]: the label holds a control character (U+0000)"),
        ({"labels": ["del\x7f"]}, "labels[0]: the label holds a control character (U+007F)"),
        ({"labels": [f"l{i}" for i in range(101)]}, "labels: 101 labels; an experiment may"),
        ({"labels": "a"}, "labels: must be a list of strings"),
        ({"labels": {"a": 1}}, "labels: must be a list of strings"),
        ({"labels": ["a", 3]}, "labels[1]: the label must be a string, not int"),
        ({"labels": [None]}, "labels[0]: the label must be a string, not NoneType"),
        ({"name": ""}, "name: must not be empty"),
        ({"name": "n" * 513}, "name: is 513 characters long; at most 512"),
        ({"name": 5}, "body name"),
        ({"description": ["x"]}, "body description"),
        ({"colour": "red"}, "body colour"),
        ({"notes": "remember"}, "notes: experiment notes are not kept"),
        ({"resources": {"priority": 0}}, "body resources.priority: Input should be"),
        ({"resources": {"priority": 100}}, "body resources.priority: Input should be"),
        ({"resources": {"weight": 0}}, "body resources.weight:"),
        ({"resources": {"weight": "heavy"}}, "body resources.weight:"),
        ({"resources": {"maxSlots": -1}}, "body resources.maxSlots: Input should be greater"),
        ({"resources": {"slots": 4}}, "body resources.slots: Extra inputs are not permitted"),
        ({"checkpointStorage": {"saveTrialBest": -1}}, "body checkpointStorage.saveTrialBest:"),
        ({"checkpointStorage": {"hostPath": "/tmp"}}, "body checkpointStorage.hostPath: Extra"),
        ({"id": 999999, "labels": ["a"]}, "id: 999999 is not the experiment in the path"),
        ({"id": "one"}, "body id"),
    ],
)
async def test_bad_patches_are_refused_and_change_nothing(
    api: httpx.AsyncClient, body: dict[str, Any], message: str
) -> None:
    experiment = await new_experiment(api, SINGLE + "labels: [keep]\n")
    path = f"/api/v1/experiments/{experiment['id']}"
    # A good field beside the bad one is not applied either.
    reply = await api.patch(path, json={"description": "changed", **body})
    assert message in refusal(reply, 400)
    stored = await experiment_of(api, experiment["id"])
    assert stored["labels"] == ["keep"] and stored["description"] == ""
    assert stored["name"] == "labelled"


async def test_values_stored_before_the_rules_do_not_block_a_change(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    """The official client sends back the name and labels it read: an old label longer
    than the limit (a config label from before) or a blank name passes as it is."""
    experiment = await new_experiment(api)
    old_label = "x" * 300
    async with session_scope(app.state.session_factory) as session:
        await session.execute(
            update(ExperimentModel)
            .where(ExperimentModel.id == experiment["id"])
            .values(labels=[old_label], name="  ")
        )
    stored = await experiment_of(api, experiment["id"])
    path = f"/api/v1/experiments/{experiment['id']}"
    reply = await api.patch(path, json=as_official_client_patches(stored, [old_label, "new"]))
    assert reply.status_code == 200, reply.text
    assert reply.json()["experiment"]["labels"] == [old_label, "new"]
    # A new label is held to the rules.
    reply = await api.patch(path, json=as_official_client_patches(stored, ["y" * 300]))
    assert "labels[0]: the label is 300 characters long" in refusal(reply, 400)


async def test_sdk_put_and_delete_of_one_label(api: httpx.AsyncClient) -> None:
    experiment = await new_experiment(api, SINGLE + "labels: [first]\n")
    base = f"/api/v1/experiments/{experiment['id']}/labels"
    reply = await api.put(f"{base}/second")
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"labels": ["first", "second"]}
    assert (await api.put(f"{base}/first")).json() == {"labels": ["first", "second"]}
    # The SDK quotes a label but leaves its slashes; a quoted slash arrives the same.
    assert (await api.put(f"{base}/a/b")).json()["labels"][-1] == "a/b"
    assert (await api.put(f"{base}/{quote('x/y é%', safe='')}")).json()["labels"][-1] == "x/y é%"
    assert (await api.delete(f"{base}/a/b")).json() == {"labels": ["first", "second", "x/y é%"]}
    assert (await api.delete(f"{base}/absent")).json()["labels"] == ["first", "second", "x/y é%"]
    stored = await experiment_of(api, experiment["id"])
    assert stored["labels"] == stored["config"]["labels"] == ["first", "second", "x/y é%"]
    assert "the label is empty" in refusal(await api.put(f"{base}/"), 400)
    assert "control character" in refusal(await api.put(f"{base}/a%09b"), 400)
    assert "at most 255" in refusal(await api.put(f"{base}/{'y' * 256}"), 400)
    assert "not found" in refusal(await api.put("/api/v1/experiments/999999/labels/x"), 404)


async def test_at_most_a_hundred_labels(api: httpx.AsyncClient) -> None:
    experiment = await new_experiment(api)
    path = f"/api/v1/experiments/{experiment['id']}"
    full = [f"l{i}" for i in range(100)]
    assert (await api.patch(path, json={"labels": full})).status_code == 200
    message = refusal(await api.put(f"{path}/labels/one-more"), 400)
    assert "has 100 labels already; at most 100" in message
    assert (await api.put(f"{path}/labels/l5")).status_code == 200  # already there: no change
    assert (await experiment_of(api, experiment["id"]))["labels"] == full


async def test_another_users_experiment_is_refused(
    api: httpx.AsyncClient,
    alice: httpx.AsyncClient,  # noqa: F811
) -> None:
    experiment = await new_experiment(api, SINGLE + "labels: [mine]\n")
    path = f"/api/v1/experiments/{experiment['id']}"
    message = refusal(await alice.patch(path, json={"labels": ["hers"]}), 403)
    assert message == (
        f"experiment {experiment['id']} belongs to determined; only its owner or an admin "
        "may change it, or whoever holds PERMISSION_TYPE_UPDATE_EXPERIMENT in its workspace "
        "(WorkspaceAdmin, Editor, EditorRestricted, EditorProjectRestricted)"
    )
    assert "may label it" in refusal(await alice.put(f"{path}/labels/hers"), 403)
    assert "may label it" in refusal(await alice.delete(f"{path}/labels/mine"), 403)
    assert (await experiment_of(alice, experiment["id"]))["labels"] == ["mine"]


async def test_labels_in_use_most_used_first(api: httpx.AsyncClient) -> None:
    assert (await api.get("/api/v1/experiment/labels")).json() == {"labels": []}
    await new_experiment(api, SINGLE + "labels: [rare, common]\n")
    await new_experiment(api, SINGLE + "labels: [common, beta]\n")
    await new_experiment(api, SINGLE + "labels: [alpha]\n")
    reply = await api.get("/api/v1/experiment/labels")
    assert reply.json() == {"labels": ["common", "alpha", "beta", "rare"]}
    assert (await api.get("/api/v1/experiment/labels?projectId=1")).status_code == 200
    assert "projectId" in refusal(await api.get("/api/v1/experiment/labels?projectId=x"), 400)


async def test_list_filters_by_every_label_given(api: httpx.AsyncClient) -> None:
    both = await new_experiment(api, SINGLE + "labels: [a, b]\n")
    only_a = await new_experiment(api, SINGLE + "labels: [a, 'a b']\n")
    await new_experiment(api, EXPERIMENT_YAML)

    async def ids(query: str) -> list[int]:
        reply = await api.get(f"/api/v1/experiments?{query}")
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["pagination"]["total"] == len(body["experiments"])
        return [e["id"] for e in body["experiments"]]

    assert await ids("labels=a") == [both["id"], only_a["id"]]
    assert await ids("labels=a&labels=b") == [both["id"]]
    assert await ids("labels=a%20b") == [only_a["id"]]
    assert await ids("labels=A") == []  # exact, as Determined's filter
    assert await ids("labels=b&limit=1&offset=0") == [both["id"]]
    assert "control character" in refusal(await api.get("/api/v1/experiments?labels=%0A"), 400)
