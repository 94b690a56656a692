"""A two-host training cluster (network namespaces, 2 artificial slots per agent) and the
helpers the training e2e tests drive it with: the example experiment, created through our
`det`, and its loss curves read back through GET /api/v1/trials/{id}/metrics."""

from __future__ import annotations

import copy
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.cluster import AgentProcess
from tests.e2e import netns
from tests.e2e.agents import trial_logs
from tests.e2e.conftest import MasterProcess, describe_run, unique

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ddp_synthetic"
AGENT_IDS = ("host-a", "host-b")  # host-a sorts first: it holds ranks 0 and 1
SLOTS_PER_AGENT = 2
# A silent agent is declared lost after this: the default, 10 s. (5 s shortened the fault
# test's wait, but its agents then fenced their ranks after 3 s without an acknowledged
# heartbeat, which four DDP ranks keeping a loaded two-core machine busy can come close to.)
LOST_AFTER_S = 10
# For "eventually": a 4-rank DDP run takes well under a minute idle, about one in CI on a
# loaded two-core machine. Under pytest-timeout's 300 s, so a miss fails with the logs.
TRIAL_TIMEOUT_S = 240.0
TERMINAL = {"COMPLETED", "CANCELED", "ERROR"}


@dataclass
class TrainingCluster:
    master: MasterProcess
    net: netns.Topology
    agents: list[AgentProcess]
    work: Path
    template: str
    checkpoint_dir: Path
    _stack: ExitStack = field(repr=False, default_factory=ExitStack)

    def diagnostics(self) -> str:
        parts = [f"--- master log ---\n{self.master.output()}"]
        parts += [f"--- agent {a.id} log ---\n{a.output()}" for a in self.agents]
        return "\n".join(parts)

    def new_agent(self, index: int) -> AgentProcess:
        host = self.net.hosts[index]
        agent = AgentProcess(
            self.master,
            AGENT_IDS[index],
            self.work / AGENT_IDS[index],
            slots=SLOTS_PER_AGENT,
            netns=host.netns,
            master_address=f"{self.net.bridge_address}:{self.master.agent_port}",
        )
        self._stack.callback(agent.stop)
        return agent

    def kill_agent(self, index: int) -> None:
        """kill -9 of the agent process; its ranks die with it (pdeathsig)."""
        self.agents[index].kill(signal.SIGKILL)

    def restart_agent(self, index: int) -> AgentProcess:
        """The same agent (id, namespace, work dir) started again."""
        agent = self.new_agent(index).start()
        self.agents[index] = agent
        agent.wait_connected()
        return agent

    # -- experiments -------------------------------------------------------------------------

    def write_config(
        self,
        *,
        slots: int,
        hparams: dict[str, Any] | None = None,
        searcher: dict[str, Any] | None = None,
        **top: Any,
    ) -> Path:
        """The example's config.yaml with these changes, in a file of its own."""
        config = copy.deepcopy(yaml.safe_load((EXAMPLE / "config.yaml").read_text()))
        config["name"] = unique("ddp-e2e")
        config["resources"]["slots_per_trial"] = slots
        config["hyperparameters"].update(hparams or {})
        config["searcher"].update(searcher or {})
        config.update(top)
        path = self.work / f"{config['name']}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        return path

    def create(self, **changes: Any) -> int:
        """An experiment of the example (write_config's changes), created with our det and
        the example's template, as the README's walkthrough does; its id."""
        result = self.create_with_output(**changes)
        assert result.returncode == 0, describe_run(result)
        return created_id(result.stdout)

    def create_with_output(self, **changes: Any) -> subprocess.CompletedProcess[str]:
        path = self.write_config(**changes)
        return self.master.det(
            "experiment", "create", "--template", self.template, str(path), str(EXAMPLE)
        )

    def trial(self, experiment_id: int) -> dict[str, Any]:
        trials = self.master.api("GET", f"/api/v1/experiments/{experiment_id}/trials")["trials"]
        assert len(trials) == 1, trials
        trial: dict[str, Any] = trials[0]
        trial["state"] = trial["state"].removeprefix("STATE_")
        return trial

    def wait_trial(
        self, experiment_id: int, states: set[str], timeout: float = TRIAL_TIMEOUT_S
    ) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            trial = self.trial(experiment_id)
            if trial["state"] in states:
                return trial
            assert trial["state"] not in TERMINAL, (
                f"experiment {experiment_id}'s trial ended {trial['state']}, not "
                f"{sorted(states)}:\n{trial}\n--- trial logs ---\n"
                f"{trial_logs(self.master, trial['id'])[-6000:]}\n{self.diagnostics()}"
            )
            return None

        return dict(
            self.master.wait_for(
                f"experiment {experiment_id}'s trial to reach {sorted(states)}", reached, timeout
            )
        )

    def completed(self, experiment_id: int, timeout: float = TRIAL_TIMEOUT_S) -> dict[str, Any]:
        return self.wait_trial(experiment_id, {"COMPLETED"}, timeout)

    def metrics(self, trial_id: int, group: str = "training") -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.master.api(
            "GET", f"/api/v1/trials/{trial_id}/metrics", params={"group": group}
        )["metrics"]
        return rows

    def curve(self, trial_id: int, group: str = "training", key: str = "loss") -> dict[int, float]:
        """Step -> metric, one value per step (a rerun's report replaces the earlier one)."""
        return {row["stepsCompleted"]: row["metrics"][key] for row in self.metrics(trial_id, group)}

    def checkpoints(self, trial_id: int) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.master.api(
            "GET", f"/api/v1/trials/{trial_id}/checkpoints"
        )["checkpoints"]
        return found

    def kill_experiment(self, experiment_id: int) -> None:
        result = self.master.det("experiment", "kill", str(experiment_id))
        assert result.returncode == 0, describe_run(result)

    def kill_experiment_now(self, experiment_id: int) -> None:
        """The kill through the REST API, without a client's start-up (seconds on a loaded
        machine): for a kill that must land while the trial runs."""
        self.master.api("POST", f"/api/v1/experiments/{experiment_id}/kill")


@contextmanager
def training_cluster(tag_source: str, work: Path) -> Iterator[TrainingCluster]:
    """Network, master, one 2-slot agent per namespace and the example's template (with its
    checkpoints under `work`); all of it removed afterwards, in reverse order."""
    with ExitStack() as stack:
        # Common to both hosts: mgmt0 and eth1; the master's rule picks eth1 (the fast link).
        net = stack.enter_context(
            netns.topology(
                netns.tag_for(tag_source),
                mgmt_names=("mgmt0", "mgmt0"),
                fast_names=("eth1", "eth1"),
            )
        )
        master = MasterProcess(work / "data", label="training", host="0.0.0.0")
        master.extra_env.update(
            DET_MASTER_EXTERNAL_URL=f"http://{net.bridge_address}:{master.port}",
            DET_MASTER_AGENT_LINK__LOST_AFTER_S=str(LOST_AFTER_S),
        )
        stack.callback(shutil.rmtree, master.scratch, ignore_errors=True)
        stack.callback(master.stop)
        master.start()

        checkpoints = work / "checkpoints"
        template = yaml.safe_load((EXAMPLE / "template.yaml").read_text())
        template["checkpoint_storage"]["host_path"] = str(checkpoints)
        template_file = work / "template.yaml"
        template_file.write_text(yaml.safe_dump(template), encoding="utf-8")
        name = unique("ddp")
        result = master.det("tpl", "set", name, str(template_file))
        assert result.returncode == 0, describe_run(result)

        cluster = TrainingCluster(master, net, [], work, name, checkpoints)
        stack.enter_context(cluster._stack)
        cluster.agents = [cluster.new_agent(i).start() for i in range(len(AGENT_IDS))]
        for agent in cluster.agents:
            agent.wait_connected()
        yield cluster
    assert not net.leftovers(), net.leftovers()


def created_id(stdout: str) -> int:
    """The id in a client's "Created experiment N" line."""
    found = re.findall(r"^Created experiment (\d+)", stdout, re.M)
    assert len(found) == 1, stdout
    return int(found[0])


def relative_difference(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else abs(a - b)


def max_relative_difference(curve: dict[int, float], baseline: dict[int, float]) -> float:
    return max(relative_difference(curve[step], baseline[step]) for step in curve)


def describe_curves(label: str, curve: dict[int, float], baseline: dict[int, float]) -> str:
    """One line of figures for `pytest -s`: steps compared, worst relative difference, and
    how many steps are bit-identical."""
    steps = sorted(curve)
    same = sum(1 for s in steps if curve[s] == baseline[s])
    worst = max(steps, key=lambda s: relative_difference(curve[s], baseline[s]))
    return (
        f"{label}: steps {steps[0]}..{steps[-1]} ({len(steps)}), bit-identical at {same}, "
        f"max relative difference {relative_difference(curve[worst], baseline[worst]):.3e} "
        f"at step {worst} ({curve[worst]!r} vs {baseline[worst]!r})"
    )
