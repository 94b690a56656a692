"""What the hub sends an agent to launch an allocation: the prepare (the chief's ports) and
the start (each agent's ranks, environment, model definition), assembled from the database
rows and the launch core (master.core.launch). The hub decides when; this decides what.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from master.core import images, launch, mounts, task_config
from master.core.errors import ConfigError
from master.core.interfaces import InterfaceChoice, choose_interface
from master.db.models import (
    AgentModel,
    AllocationModel,
    ExperimentModel,
    ModelDefinitionModel,
    SlotModel,
    TaskContextModel,
    TaskModel,
    TrialModel,
    UserModel,
)
from master.services import allocations, trial_reports
from master.services import auth as auth_service
from master.settings import MasterSettings
from resolute_proto.agent.v1 import agent_pb2 as pb

log = logging.getLogger(__name__)

TASK_TOKEN_TTL = timedelta(days=7)
# Where a message goes: (agent id, message).
Outgoing = tuple[str, pb.MasterMessage]


def rank_specs(ranks: Sequence[launch.RankPlan]) -> list[pb.RankSpec]:
    return [pb.RankSpec(rank=r.rank, local_rank=r.local_rank, slot_ids=r.slot_ids) for r in ranks]


class LaunchAssembler:
    def __init__(self, settings: MasterSettings, *, cluster_id: str, master_id: str) -> None:
        self.settings = settings
        self.cluster_id = cluster_id
        self.master_id = master_id

    def default_variables(self, pool_name: str, device_type: str) -> dict[str, str]:
        defaults = self.settings.container_defaults(pool_name).environment_variables
        return launch.runtime_variables(defaults, device_type)

    async def choose_interface(
        self,
        session: AsyncSession,
        agent_ids: list[str],
        resource_pool: str,
        experiment: ExperimentModel | None,
    ) -> InterfaceChoice:
        """dtrain_network_interface (the experiment's, else the pool's default) checked
        against what the gang's agents reported, or one every agent has."""
        environment = (experiment.config.get("environment") if experiment else None) or {}
        explicit = (
            environment.get("dtrain_network_interface")
            or self.settings.container_defaults(resource_pool).dtrain_network_interface
        )
        rows = (
            await session.execute(
                select(AgentModel.id, AgentModel.interfaces).where(AgentModel.id.in_(agent_ids))
            )
        ).all()
        reported = {
            agent_id: {i["name"]: list(i.get("ipv4", [])) for i in interfaces or []}
            for agent_id, interfaces in rows
        }
        return choose_interface({a: reported.get(a, {}) for a in agent_ids}, explicit)

    @staticmethod
    def prepare(allocation_id: str, experiment: ExperimentModel | None) -> pb.MasterMessage:
        """Ask the chief for the rendezvous port (and, per agent, Determined's two more)."""
        layout = launch.stored_layout(experiment.config) if experiment else launch.PER_SLOT
        return pb.MasterMessage(
            prepare=pb.PrepareAllocation(
                allocation_id=allocation_id,
                # Determined's ZMQ broadcast listens on two more ports of the chief.
                extra_ports=2 if layout == launch.PER_AGENT else 0,
            )
        )

    @staticmethod
    def prepare_task(allocation_id: str) -> pb.MasterMessage:
        """A task's one process needs no rendezvous, but its server needs a port."""
        return pb.MasterMessage(prepare=pb.PrepareAllocation(allocation_id=allocation_id))

    async def trial_start(
        self,
        session: AsyncSession,
        allocation: AllocationModel,
        members: list[launch.GangMember],
        addresses: tuple[str, ...],
        master_port: int,
        extra_ports: tuple[int, ...] = (),
    ) -> list[Outgoing] | None:
        """Each agent's StartAllocation for a trial's gang (chief first); None when the
        chief's answer lacks the ports this layout needs (an answer to an older prepare).
        Issues the run's API token and records where the run resumes. Raises
        launch.LaunchError for a configuration that cannot be launched."""
        # What the launch needs, in one statement rather than four.
        found = (
            await session.execute(
                select(TrialModel, ExperimentModel, ModelDefinitionModel, UserModel)
                .join(ExperimentModel, ExperimentModel.id == TrialModel.experiment_id)
                .outerjoin(
                    ModelDefinitionModel,
                    ModelDefinitionModel.experiment_id == ExperimentModel.id,
                )
                .outerjoin(UserModel, UserModel.id == ExperimentModel.owner_id)
                .where(TrialModel.id == allocation.trial_id)
            )
        ).one()  # foreign keys: the trial and its experiment exist
        trial, experiment, model_definition, owner = found
        layout = launch.stored_layout(experiment.config)
        if layout == launch.PER_AGENT and len(extra_ports) < 2:
            return None
        token, allocation.task_session_id = await auth_service.issue_task_token(
            session, experiment.owner_id, TASK_TOKEN_TTL, trial.id
        )
        resume = await trial_reports.resume_point(session, trial, experiment)
        steps_completed = await trial_reports.start_run_from(session, trial, resume)
        info = launch.TrialInfo(
            experiment_id=experiment.id,
            trial_id=trial.id,
            run_id=trial.run_id,
            task_id=allocations.task_id(trial),
            allocation_id=allocation.id,
            seed=trial.seed,
            hparams=trial.hparams,
            # DET_EXPERIMENT_CONFIG and trial.json: the ranks never see registry credentials.
            config=images.without_registry_auth(experiment.config),
            steps_completed=steps_completed,
            latest_checkpoint=resume.uuid if resume is not None else "",
            user=owner.username if owner else "",
            session_token=token,
        )
        device_type = await gang_device_type(session, members)
        argv = launch.entrypoint_argv(experiment.config)
        launches = launch.build_launches(
            members,
            info,
            launch.Rendezvous(
                allocation.network_interface,
                allocation.chief_address,
                master_port,
                addresses=addresses,
                comm_ports=extra_ports,
            ),
            master_url=self.settings.master_url,
            cluster_id=self.cluster_id,
            master_id=self.master_id,
            device_type=device_type,
            layout=layout,
            default_variables=self.default_variables(allocation.resource_pool, device_type),
        )
        archive = model_definition.archive if model_definition else b""
        container = container_message(
            images.container_spec(
                experiment.config,
                device_type,
                self.settings.container_defaults(allocation.resource_pool).registry_auth,
            )
        )
        bind_mounts = _bind_mounts(experiment.config)
        shm_size_bytes = mounts.shm_bytes(
            (experiment.config.get("resources") or {}).get("shm_size")
        )
        per_agent = layout == launch.PER_AGENT
        log.info(
            "allocation %s starting (%s): %d processes on %s, rendezvous %s:%d over %s",
            allocation.id,
            layout,
            sum(len(x.ranks) for x in launches),
            ", ".join(m.agent_id for m in members),
            allocation.chief_address,
            master_port,
            allocation.network_interface,
        )
        return [
            (
                agent_launch.agent_id,
                pb.MasterMessage(
                    start=pb.StartAllocation(
                        allocation_id=allocation.id,
                        trial_id=trial.id,
                        experiment_id=experiment.id,
                        ranks=rank_specs(agent_launch.ranks),
                        argv=argv,
                        env=agent_launch.env,
                        model_definition=archive,
                        stop_grace_s=self.settings.agent_link.stop_grace_s,
                        layout=pb.LAUNCH_LAYOUT_PER_AGENT
                        if per_agent
                        else pb.LAUNCH_LAYOUT_PER_SLOT,
                        info_files=agent_launch.info_files,
                        shared_fs_host_path=launch.shared_fs_host_path(experiment.config),
                        bind_mounts=bind_mounts,
                        shm_size_bytes=shm_size_bytes,
                        owner_id=experiment.owner_id or 0,
                        container=container,
                    )
                ),
            )
            for agent_launch in launches
        ]

    async def task_start(
        self,
        session: AsyncSession,
        allocation: AllocationModel,
        members: list[launch.GangMember],
        port: int,
    ) -> Outgoing:
        """The StartAllocation of a task (notebook, shell, command, TensorBoard): its one
        process, with the owner's own API access (as Determined gives a notebook: `det`
        inside it acts as the user), revoked when the task ends."""
        found = (
            await session.execute(
                select(TaskModel, UserModel)
                .join(UserModel, UserModel.id == TaskModel.owner_id)
                .where(TaskModel.id == allocation.task_id)
            )
        ).one()  # foreign keys: the task and its owner exist
        task, owner = found
        context = await session.get(TaskContextModel, task.id)  # `det cmd run -c DIR`
        token, allocation.task_session_id = await auth_service.issue_interactive_token(
            session, owner.id, TASK_TOKEN_TTL, f"{task.type.lower()} {task.uuid}"
        )
        try:
            config = task_config.validate_task_config(task.config, task.type)
            shm_size_bytes = mounts.shm_bytes(config.resources.shm_size)
        except (ConfigError, ValueError) as exc:
            # A task queued before this master checked what it now applies (its mounts
            # and /dev/shm): it ends, saying why, rather than failing the hub's tick.
            raise launch.LaunchError(f"config: {exc}") from None
        device_type = await gang_device_type(session, members)
        info = launch.TaskInfo(
            task_id=task.uuid,
            task_type=task.type,
            allocation_id=allocation.id,
            config=images.without_registry_auth(task.config),
            argv=tuple(
                task_config.task_argv(
                    task.type,
                    config,
                    task_uuid=task.uuid,
                    port=port,
                    experiment_ids=task.experiment_ids,
                    trial_ids=task.trial_ids,
                )
            ),
            port=port,
            secret=task.secret,
            user=owner.username,
            session_token=token,
        )
        agent_launch = launch.build_task_launch(
            members[0],
            info,
            master_url=self.settings.master_url,
            cluster_id=self.cluster_id,
            master_id=self.master_id,
            device_type=device_type,
            default_variables=self.default_variables(allocation.resource_pool, device_type),
        )
        log.info(
            "%s %s starting on %s (port %d): %s",
            task.type.lower(),
            task.uuid,
            agent_launch.agent_id,
            port,
            " ".join(info.argv)[:200],
        )
        message = pb.MasterMessage(
            start=pb.StartAllocation(
                allocation_id=allocation.id,
                ranks=rank_specs(agent_launch.ranks),
                argv=list(info.argv),
                env=agent_launch.env,
                # The agent unpacks it into the task's working directory, as a trial's.
                model_definition=context.archive if context is not None else b"",
                stop_grace_s=self.settings.agent_link.stop_grace_s,
                layout=pb.LAUNCH_LAYOUT_PER_SLOT,
                bind_mounts=_bind_mounts(task.config),
                shm_size_bytes=shm_size_bytes,
                owner_id=owner.id,
                container=container_message(
                    images.container_spec(
                        task.config,
                        device_type,
                        self.settings.container_defaults(allocation.resource_pool).registry_auth,
                    )
                ),
            )
        )
        return agent_launch.agent_id, message


def container_message(spec: images.ContainerSpec | None) -> pb.Container | None:
    """The protocol's Container of a launch; None leaves StartAllocation.container unset,
    and the agent runs the processes on its host."""
    if spec is None:
        return None
    return pb.Container(
        image=spec.image,
        force_pull=spec.force_pull,
        registry_auth=pb.RegistryAuth(**spec.registry_auth) if spec.registry_auth else None,
        devices=[
            pb.DeviceMapping(
                host_path=d.host_path,
                container_path=d.container_path,
                cgroup_permissions=d.cgroup_permissions,
            )
            for d in spec.devices
        ],
    )


def _bind_mounts(config: Mapping[str, object]) -> list[pb.BindMount]:
    return [
        pb.BindMount(host_path=m.host_path, container_path=m.container_path, read_only=m.read_only)
        for m in mounts.requested_mounts(config)
    ]


async def gang_device_type(session: AsyncSession, members: list[launch.GangMember]) -> str:
    """The device type of the gang's first slot ("cpu" for a zero-slot task)."""
    for member in members:
        if member.slot_ids:
            device_type = await session.scalar(
                select(SlotModel.device_type).where(
                    SlotModel.agent_id == member.agent_id,
                    SlotModel.slot_id == member.slot_ids[0],
                )
            )
            return device_type or "cpu"
    return "cpu"
