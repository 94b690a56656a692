"""Rank processes on this agent: unpack, spawn one process per rank, pump logs, gang exits.

Gang rule on one agent: when a rank exits non-zero on its own, every other local rank is
stopped (SIGTERM to its process group, SIGKILL after the grace period) and the master is
told FAILED, so it stops the ranks on the other agents too. Ranks die with the agent:
each is started with PR_SET_PDEATHSIG, so `kill -9` of the agent leaves no orphan holding
a GPU or the rendezvous port.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import re
import shutil
import signal
import sys
import tarfile
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import bootstrap, containers, ports, rank_user, storage_secrets
from agent.fence import FenceProcess
from agent.rank_user import RankUser, UidPool
from resolute.storage import CLOUD_TYPES as CLOUD_STORAGE
from resolute_proto.agent.v1 import agent_pb2 as pb

log = logging.getLogger(__name__)

MAX_LINE = 64 * 1024
# The test write to a trial's object store before its ranks start (connect and retries).
STORAGE_CHECK_TIMEOUT_S = 60.0
# Why ranks ended when the agent's fence killed them (agent/fence.py).
FENCED_MESSAGE = (
    "fenced: the master acknowledged no heartbeat in time, so it may have placed the trial "
    "elsewhere; the ranks were killed before it could run twice"
)
# Determined's wrap_rank prefixes every line of a rank with this.
RANK_PREFIX = re.compile(rb"^\[rank=(\d+)\] ")
# How long removing an ended allocation's containers may take before its exit is reported
# anyway (a runtime that hangs must not hold the slots forever).
REMOVE_TIMEOUT_S = 60.0
# A TLS agent's CA file, copied into each per-slot run's directory for its ranks.
MASTER_CERT = ".det-master-ca.crt"


# Ranks die with the agent: setpriv (util-linux) sets PR_SET_PDEATHSIG and execs the rank.
# Doing it in a preexec_fn instead forces a real fork() of a process running gRPC threads,
# which crashed children here (SIGSEGV); without preexec_fn Python spawns with vfork.
# Popen's user=/group= would force that fork too, so setpriv switches the ranks' user as
# well (agent/rank_user.py).
SETPRIV = rank_user.SETPRIV


def _die_with_agent(argv: list[str], rank: RankUser | None = None) -> list[str]:
    return rank_user.command(argv, setpriv=SETPRIV, die_with_agent=True, rank=rank)


class LaunchFailed(Exception):
    pass


@dataclass
class AllocationRun:
    allocation_id: str
    work_dir: Path
    grace_s: float
    processes: dict[int, asyncio.subprocess.Process] = field(default_factory=dict)
    exit_codes: dict[int, int] = field(default_factory=dict)
    kind: pb.ExitKind = pb.EXIT_KIND_UNSPECIFIED
    message: str = ""
    stopping: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    per_agent: bool = False  # Determined's layout: one process, ranks tagged by its output
    started_at: float = float("inf")  # time.monotonic() when its ranks were spawned
    rank: RankUser | None = None  # its own uid of rank_uid_range, if the agent has one
    # Its shared_fs checkpoint directory on this agent, when `rank` is its own uid: opened
    # to the ranks before they start, and what they wrote given to its owner when they end.
    checkpoints: Path | None = None
    # The experiment's bind_mounts and private /dev/shm (0: the host's), made in the
    # process's mount namespace; a per_slot launch gets one only when it asks for these.
    mounts: list[bootstrap.Mount] = field(default_factory=list)
    shm_size_bytes: int = 0
    # The image its ranks run in (agent/containers.py), when the agent has a runtime.
    container: pb.Container | None = None
    container_pids: dict[int, int] = field(default_factory=dict)  # rank -> its first process
    # A per_slot launch of several ranks in one container (containers.GROUP_LAUNCHER): each
    # rank's end comes as a line of the container's output, not as a process's exit.
    grouped: bool = False
    rank_exits: dict[int, asyncio.Future[int]] = field(default_factory=dict)
    stop_requested: asyncio.Event = field(default_factory=asyncio.Event)  # ends a pull's wait
    finishing: bool = False  # _finish has begun (it awaits before it forgets the run)

    @property
    def namespaced(self) -> bool:
        if self.container is not None:
            return False  # the container is its namespaces
        return self.per_agent or bool(self.mounts) or self.shm_size_bytes > 0


Emit = Callable[[pb.AgentMessage], None]
LogSink = Callable[[pb.LogEntry], None]


class Runner:
    def __init__(
        self,
        agent_id: str,
        work_dir: Path,
        devices: list[pb.Device],
        emit: Emit,
        logs: LogSink,
        fence: FenceProcess | None = None,
    ) -> None:
        self.agent_id = agent_id
        # Kills the ranks when the master's acknowledgements stop (agent/fence.py).
        self.fence = fence
        self.work_dir = work_dir
        self.devices = {d.slot_id: d for d in devices}
        self.emit = emit
        self.logs = logs
        self.runs: dict[str, AllocationRun] = {}
        self.unacked: dict[str, pb.AllocationExited] = {}
        self.ports: dict[str, list[int]] = {}
        # The ports prepare() picks from (agent/ports.py: port_range outside the ephemeral range).
        self.port_pool: list[int] = ports.candidates(
            ports.parse_port_range(ports.DEFAULT_PORT_RANGE), ports.ephemeral_range()
        )
        self.port_is_free: Callable[[int], bool] = ports.bindable
        self._tasks: set[asyncio.Task[None]] = set()
        self.all_acked = asyncio.Event()
        self.all_acked.set()
        # Why this agent cannot run Determined-style launches (bootstrap.probe_namespaces).
        self.namespace_problem: str | None = None
        # Whom ranks run as (setting rank_user; None: the agent's user), and values (the join
        # token) no variable handed to a rank may contain.
        self.rank_user: RankUser | None = None
        # Or (setting rank_uid_range) a uid of their own per run, taken at its start.
        self.rank_uids: UidPool | None = None
        self.withheld: tuple[str, ...] = ()
        # The CA this agent verifies the master with (its master_cert_file): every run gets a
        # copy, so its ranks verify the master over https too (DET_MASTER_CERT_FILE).
        self.master_cert_file: Path | None = None
        self.master_cert_name: str | None = None
        # The container runtime launches that name an image run in (None: on the host).
        self.runtime: containers.Runtime | None = None
        self.puller: containers.ImagePuller | None = None
        self.limits: list[str] = []  # the runtime's --ulimit options (this host's limits)

    def use_runtime(self, runtime: containers.Runtime) -> None:
        self.runtime = runtime
        pulls = self.work_dir / "secrets" / "pulls"
        shutil.rmtree(pulls, ignore_errors=True)  # credentials of pulls a killed agent left
        self.puller = containers.ImagePuller(runtime, pulls)
        self.limits = containers.host_limits(runtime)

    def spawn_task(self, work: Coroutine[Any, Any, None]) -> None:
        """Fire and forget, keeping a reference so the task is not collected mid-way."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- what the master asks ----------------------------------------------------------------

    def prepare(self, allocation_id: str, extra_ports: int = 0) -> pb.AllocationPrepared:
        """Reserve free ports for the chief: the rendezvous, and `extra_ports` more (the
        same ones if asked twice)."""
        if len(self.ports.get(allocation_id, ())) < 1 + extra_ports:
            try:
                taken = {port for held in self.ports.values() for port in held}
                self.ports[allocation_id] = ports.pick_ports(
                    1 + extra_ports, self.port_pool, taken, self.port_is_free
                )
            except OSError as exc:
                return pb.AllocationPrepared(
                    allocation_id=allocation_id, error=f"no free port for the rendezvous: {exc}"
                )
        first, *rest = self.ports[allocation_id]
        return pb.AllocationPrepared(
            allocation_id=allocation_id, master_port=first, extra_ports=rest
        )

    async def start(self, start: pb.StartAllocation) -> None:
        allocation_id = start.allocation_id
        if allocation_id in self.runs or allocation_id in self.unacked:
            return  # a repeat after a reconnect
        run = AllocationRun(
            allocation_id,
            self.work_dir / "allocations" / allocation_id,
            start.stop_grace_s,
            per_agent=start.layout == pb.LAUNCH_LAYOUT_PER_AGENT,
            shm_size_bytes=max(start.shm_size_bytes, 0),
        )
        run.mounts = bootstrap.plan_mounts(
            [(m.host_path, m.container_path, m.read_only) for m in start.bind_mounts],
            str(bootstrap.WORKDIR) if run.per_agent else str(run.work_dir),
            run.work_dir / "run" / "workdir" if run.per_agent else run.work_dir,
        )
        self.runs[allocation_id] = run
        image = start.container.image if start.HasField("container") else ""
        if image and self.runtime is not None:
            run.container = start.container
            run.grouped = not run.per_agent and len(start.ranks) > 1
        elif image:
            self._note(
                run,
                -1,
                f"environment.image {image} is not used: this agent runs no container runtime "
                "(--container-runtime), so the ranks run on the host",
            )
        try:
            if self.rank_uids is not None:
                run.rank = self.rank_uids.take(allocation_id, rank_user.owner_group(start.owner_id))
            # Beside the allocation's directory, not in it: that is the ranks' cwd.
            storage_secrets.move_s3_keys(
                start.env, start.info_files, self._secrets_dir(run), self._user(run)
            )
            if run.per_agent:
                problem = await self._prepare_determined(start, run)
                if problem:
                    run.kind, run.message = pb.EXIT_KIND_UNRUNNABLE, problem
                    self._note(run, -1, f"cannot start: {problem}")
                    run.stopping = True
            else:
                await asyncio.to_thread(_unpack, start.model_definition, run.work_dir)
                if self.master_cert_file is not None:
                    shutil.copyfile(self.master_cert_file, run.work_dir / MASTER_CERT)
                problem = await asyncio.to_thread(self._mounts_problem, run)
                if problem:
                    run.kind, run.message = pb.EXIT_KIND_UNRUNNABLE, problem
                    self._note(run, -1, f"cannot start: {problem}")
                    run.stopping = True
            if not run.stopping and run.rank is not None:
                problem = await asyncio.to_thread(self._checkpoints_problem, start, run)
                if problem:
                    run.kind, run.message = pb.EXIT_KIND_UNRUNNABLE, problem
                    self._note(run, -1, f"cannot start: {problem}")
                    run.stopping = True
            if not run.stopping:
                await asyncio.to_thread(self._hand_over, run)
                problem = await self._storage_problem(start, run)
                if problem:
                    run.kind, run.message = pb.EXIT_KIND_FAILED, problem
                    self._note(run, -1, problem)
                    run.stopping = True
            if not run.stopping and run.container is not None:
                # A variable no env file can carry is known before anything is pulled; as a
                # failed pull, it would fail every try alike: no restart.
                problem = containers.env_problem(start.env) or await self._pull(run)
                if problem:
                    run.kind, run.message = pb.EXIT_KIND_UNRUNNABLE, problem
                    self._note(run, -1, f"cannot start: {problem}")
                    run.stopping = True
            if not run.stopping and self.fence is not None and self.fence.expired():
                # The master may have given up on us already: the fence would kill them.
                run.kind, run.message = pb.EXIT_KIND_FENCED, FENCED_MESSAGE
                run.stopping = True
            run.started_at = time.monotonic()
            if run.grouped and not run.stopping:
                client = await self._spawn_container(start, list(start.ranks), run)
                loop = asyncio.get_running_loop()
                for spec in start.ranks:
                    run.processes[spec.rank] = client
                    run.rank_exits[spec.rank] = loop.create_future()
            for spec in [] if run.grouped else start.ranks:
                if run.stopping:
                    break  # a stop arrived while we were starting: start no more ranks
                run.processes[spec.rank] = await self._spawn(start, spec, run)
            if run.container is not None and not run.stopping:
                await self._guard_containers(run)
        except Exception as exc:  # anything: a run must never stay half-started
            run.kind, run.message = pb.EXIT_KIND_FAILED, f"could not start: {exc}"
            self._note(run, -1, run.message)
            run.stopping = True
        if run.stopping:
            await self._stop_processes(run)
            await self._finish(run)
            return
        self.emit(
            pb.AgentMessage(
                started=pb.AllocationStarted(
                    allocation_id=allocation_id, pids=[p.pid for p in run.processes.values()]
                )
            )
        )
        log.info("allocation %s: started ranks %s", allocation_id, sorted(run.processes))
        for rank, process in run.processes.items():
            run.tasks.append(asyncio.create_task(self._watch(run, rank, process)))
        if run.grouped:
            client = next(iter(run.processes.values()))
            run.tasks.append(asyncio.create_task(self._watch_group(run, client)))

    async def stop(self, allocation_id: str, reason: str, grace_s: float) -> None:
        run = self.runs.get(allocation_id)
        if run is None:
            if self.ports.pop(allocation_id, None) is None and allocation_id not in self.unacked:
                # The master thinks ranks run here that do not (a start lost on the way):
                # say they are gone, or it would wait for them forever.
                exited = pb.AllocationExited(
                    allocation_id=allocation_id,
                    kind=pb.EXIT_KIND_STOPPED,
                    message="no ranks of it run on this agent",
                )
                self._remember_exit(exited)
            return
        if run.stopping:
            return
        run.stopping = True
        run.stop_requested.set()
        run.grace_s = grace_s
        if run.kind == pb.EXIT_KIND_UNSPECIFIED:
            run.kind, run.message = pb.EXIT_KIND_STOPPED, reason
        self._note(run, -1, f"stopping: {reason}")
        if run.tasks:  # started: otherwise start() sees `stopping` and winds it up
            await self._stop_processes(run)

    def ack(self, allocation_id: str) -> None:
        self.unacked.pop(allocation_id, None)
        if not self.unacked:
            self.all_acked.set()

    def _remember_exit(self, exited: pb.AllocationExited) -> None:
        """Kept (and repeated in every Hello) until the master acknowledges it."""
        self.unacked[exited.allocation_id] = exited
        self.all_acked.clear()
        self.emit(pb.AgentMessage(exited=exited))

    def running(self) -> list[pb.RunningAllocation]:
        return [
            pb.RunningAllocation(allocation_id=a, ranks=sorted(r.processes))
            for a, r in self.runs.items()
        ]

    async def shutdown(self) -> None:
        for allocation_id in list(self.runs):
            await self.stop(allocation_id, "agent shutting down", 5.0)
        for run in list(self.runs.values()):
            await asyncio.gather(*run.tasks, return_exceptions=True)

    # -- processes -------------------------------------------------------------------------

    async def _prepare_determined(
        self, start: pb.StartAllocation, run: AllocationRun
    ) -> str | None:
        """Lay out what Determined's harness reads (the context unpacked twice: the working
        directory and the clean copy in train/model; the info files), then check the
        interpreter. Returns why the allocation cannot run here, if it cannot."""
        if self.namespace_problem and run.container is None:
            return f"this agent cannot run Determined-style launches: {self.namespace_problem}"
        if not start.ranks or not start.argv:
            return "the entrypoint is empty"
        slots = start.ranks[0].slot_ids
        gpu_uuids = [
            self.devices[s].uuid
            for s in slots
            if s in self.devices and self.devices[s].type == "cuda"
        ]
        problem = await asyncio.to_thread(
            _lay_out_determined,
            start,
            run.work_dir,
            gpu_uuids,
            self.master_cert_file,
            self.master_cert_name,
        )
        problem = problem or await asyncio.to_thread(self._mounts_problem, run)
        if problem:
            return problem
        await asyncio.to_thread(self._hand_over, run)  # the probe runs as the rank user
        if run.container is not None:
            return None  # the image's Python is the user's; Determined's own images have it
        env = self._rank_env(start, start.ranks[0], run)
        return await asyncio.to_thread(
            bootstrap.interpreter_problem,
            list(start.argv),
            env,
            run.work_dir / "run",
            start.shared_fs_host_path,
            run.work_dir / "tmp",
            self._switch(run),
            shm_size_bytes=run.shm_size_bytes,
            mounts=run.mounts,
        )

    def _checkpoints_problem(self, start: pb.StartAllocation, run: AllocationRun) -> str | None:
        """Open the trial's shared_fs store to its ranks' own uid (rank_user.
        open_checkpoint_dir) and check they can reach it: why they cannot, else None. A
        per_agent trial reaches it through its mount, so only the store itself counts."""
        assert run.rank is not None
        run.checkpoints = shared_fs_directory(start.env)
        if run.checkpoints is None:
            return None
        problem = rank_user.open_checkpoint_dir(run.checkpoints)
        if problem:
            return problem
        # What the uid left there when this agent could not seal it (it was killed): the
        # uid's earlier run's, maybe another owner's.
        self._seal(run, run.rank, run.checkpoints)
        if run.per_agent or SETPRIV is None:
            return None
        problem = rank_user.reach_problem(
            run.rank, run.checkpoints, SETPRIV, "checkpoint_storage.host_path"
        )
        if problem:
            return (
                f"{problem}; or start the agent with --rank-user root to run ranks as root "
                "(they can then read its secrets and every trial's files)"
            )
        return None

    def _mounts_problem(self, run: AllocationRun) -> str | None:
        """Why the experiment's mounts cannot be made here (a host path missing on this
        agent, say), checked before anything of the trial runs; their mount points are
        made now."""
        if run.container is not None:
            return containers.mounts_problem(
                [(m.host_path, m.target) for m in run.mounts],
                [(d.host_path, d.container_path) for d in run.container.devices],
            )
        if not run.namespaced:
            return None
        if self.namespace_problem:
            return (
                "this agent cannot give the trial the bind_mounts or resources.shm_size it "
                f"asks for: {self.namespace_problem}"
            )
        return bootstrap.prepare_mounts(run.mounts)

    async def _storage_problem(self, start: pb.StartAllocation, run: AllocationRun) -> str | None:
        """Write, read and delete a file in the trial's object store before any rank
        starts, so a wrong bucket, endpoint or credential fails the trial in seconds with
        the store's own words, not at its first checkpoint. Run in the ranks' environment
        (their credential chain); file systems are checked by the code that writes them."""
        try:
            config = json.loads(start.env.get(storage_secrets.CONFIG_VARIABLE, ""))
        except ValueError:
            return None
        storage = config.get("checkpoint_storage") if isinstance(config, dict) else None
        if not isinstance(storage, dict) or storage.get("type") not in CLOUD_STORAGE:
            return None
        if not start.ranks:
            return None
        env = self._rank_env(start, start.ranks[0], run)
        check = await asyncio.create_subprocess_exec(
            *_die_with_agent([sys.executable, "-m", "resolute.storage_check"], self._user(run)),
            cwd=run.work_dir,
            env=env,
            umask=self._umask(run),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            output, _ = await asyncio.wait_for(
                check.communicate(json.dumps(storage).encode()), STORAGE_CHECK_TIMEOUT_S
            )
        except TimeoutError:
            check.kill()
            await check.wait()
            return (
                f"checkpoint storage {storage.get('type')} did not answer a test write within "
                f"{STORAGE_CHECK_TIMEOUT_S:g} s"
            )
        if check.returncode == 0:
            return None
        lines = output.decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else f"checkpoint storage check exited {check.returncode}"

    async def _pull(self, run: AllocationRun) -> str | None:
        """Have the run's image on this agent (one pull per image, its progress in the
        trial's logs): None, or the registry's reason on one line."""
        assert run.container is not None and self.puller is not None
        spec = run.container
        auth = None
        if spec.HasField("registry_auth"):
            fields = ("username", "password", "auth", "serveraddress")
            auth = {
                key: getattr(spec.registry_auth, key)
                for key in (*fields, "identitytoken", "registrytoken")
                if getattr(spec.registry_auth, key)
            }
        pulling = asyncio.ensure_future(
            self.puller.ensure(
                spec.image, auth, spec.force_pull, lambda line: self._note(run, -1, line)
            )
        )
        stopped = asyncio.ensure_future(run.stop_requested.wait())
        try:
            await asyncio.wait({pulling, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if not pulling.done():
            pulling.cancel()  # a stop came first: start() winds the run up; the pull goes on
            return None
        try:
            pulling.result()
        except containers.ImageProblem as exc:
            return str(exc)
        except OSError as exc:
            return f"pulling image {spec.image} failed: {exc}"
        return None

    async def _spawn(
        self, start: pb.StartAllocation, spec: pb.RankSpec, run: AllocationRun
    ) -> asyncio.subprocess.Process:
        if run.container is not None:
            return await self._spawn_container(start, [spec], run)
        env = self._rank_env(start, spec, run)
        argv = list(start.argv)
        if not argv:
            raise LaunchFailed("the entrypoint is empty")
        where = run.work_dir / "run" / "workdir" if run.per_agent else run.work_dir
        if shutil.which(argv[0], path=env["PATH"]) is None and not (where / argv[0]).exists():
            raise LaunchFailed(f"entrypoint command {argv[0]!r} not found on PATH")
        if run.namespaced:
            # The namespace's init sets up its mounts as root, then drops to the rank user.
            argv = bootstrap.wrap(
                argv,
                run.work_dir / "run" if run.per_agent else None,
                start.shared_fs_host_path if run.per_agent else "",
                run.work_dir / "tmp" if run.per_agent else None,
                self._switch(run),
                shm_size_bytes=run.shm_size_bytes,
                mounts=run.mounts,
            )
        process = await asyncio.create_subprocess_exec(
            *_die_with_agent(argv, None if run.namespaced else self._user(run)),
            cwd=run.work_dir,
            env=env,
            umask=self._umask(run),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # one process group per rank: stop kills its children too
            limit=MAX_LINE,
        )
        self._attach(run, spec.rank, process)
        return process

    async def _spawn_container(
        self, start: pb.StartAllocation, specs: list[pb.RankSpec], run: AllocationRun
    ) -> asyncio.subprocess.Process:
        """One rank, or every rank of a grouped run, in a container (agent/containers.py):
        the runtime's client, attached, in a process group of its own; the container's
        first process is guarded once it runs (_guard_containers)."""
        assert run.container is not None and self.runtime is not None
        if not start.argv:
            raise LaunchFailed("the entrypoint is empty")
        spec = min(specs, key=lambda one: one.rank)  # names the container and its files
        env = self._rank_env(start, spec, run)
        argv = list(start.argv)
        if run.grouped:
            argv = self._group_ranks(start, specs, run, env)
            for one in specs:  # reading before the launcher opens them for writing
                for stream in ("stdout", "stderr"):
                    fifo = run.work_dir / ".ranks" / f"{one.rank}.{stream[3:]}"
                    run.tasks.append(
                        asyncio.create_task(self._pump_fifo(run, one.rank, fifo, stream))
                    )
        volumes: list[containers.Volume] = []
        if run.per_agent:
            workdir = str(bootstrap.WORKDIR)
            volumes.append(
                containers.Volume(str(run.work_dir / "run"), str(bootstrap.RUN_DETERMINED))
            )
            if start.shared_fs_host_path:
                volumes.append(
                    containers.Volume(start.shared_fs_host_path, str(bootstrap.SHARED_FS))
                )
        else:
            workdir = str(run.work_dir)
            volumes.append(containers.Volume(workdir, workdir))
            volumes.append(containers.library_volume())
            env["PYTHONPATH"] = containers.python_path(env)
            store = shared_fs_host_path(start.env)
            if store is not None:
                store.mkdir(parents=True, exist_ok=True)
                volumes.append(containers.Volume(str(store), str(store)))
        secrets = self._secrets_dir(run)
        if secrets.is_dir():  # the S3 keys' file its variable names (storage_secrets)
            volumes.append(containers.Volume(str(secrets), str(secrets), read_only=True))
        volumes += [containers.Volume(m.host_path, m.target, m.read_only) for m in run.mounts]
        private = self._container_dir(run)
        private.mkdir(mode=0o700, parents=True, exist_ok=True)
        env_file = private / f"{spec.rank}.env"
        descriptor = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write(containers.env_file_text(env))
        id_file = private / f"{spec.rank}.id"
        id_file.unlink(missing_ok=True)
        user = self._user(run)
        groups: list[int] = []
        if user is not None and user.init_groups:  # as initgroups gives them on the host
            groups = [g for g in os.getgrouplist(user.name, user.gid) if g != user.gid]
        devices = [self.devices[s] for one in specs for s in one.slot_ids if s in self.devices]
        rank_container = containers.RankContainer(
            name=containers.container_name(run.allocation_id, spec.rank),
            agent_id=self.agent_id,
            allocation_id=run.allocation_id,
            image=run.container.image,
            argv=argv,
            workdir=workdir,
            env_file=str(env_file),
            volumes=volumes,
            devices=[
                (d.host_path, d.container_path, d.cgroup_permissions) for d in run.container.devices
            ],
            gpus=[d.uuid for d in devices if d.type == "cuda" and d.uuid],
            shm_size_bytes=run.shm_size_bytes or containers.DEFAULT_SHM_BYTES,
            user=(user.uid, user.gid) if user is not None else None,
            groups=groups,
            id_file=str(id_file),
        )
        log.info(
            "allocation %s: rank(s) %s in container %s of %s",
            run.allocation_id,
            ",".join(str(one.rank) for one in specs),
            rank_container.name,
            rank_container.image,
        )
        process = await asyncio.create_subprocess_exec(
            *_die_with_agent(containers.run_argv(self.runtime, rank_container, self.limits)),
            cwd=run.work_dir,
            env=self._agent_env(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            limit=MAX_LINE,
        )
        self._attach(run, spec.rank, process)
        return process

    def _attach(self, run: AllocationRun, rank: int, process: asyncio.subprocess.Process) -> None:
        """Guard a started process group with the fence and pump its output to the logs."""
        if self.fence is not None:
            self.fence.guard(process.pid)
        assert process.stdout is not None and process.stderr is not None
        run.tasks.append(asyncio.create_task(self._pump(run, rank, process.stdout, "stdout")))
        run.tasks.append(asyncio.create_task(self._pump(run, rank, process.stderr, "stderr")))

    def _group_ranks(
        self,
        start: pb.StartAllocation,
        specs: list[pb.RankSpec],
        run: AllocationRun,
        common: dict[str, str],
    ) -> list[str]:
        """Lay out a grouped run's ranks for containers.GROUP_LAUNCHER in its working
        directory: per rank, the variables that differ from `common` (left in `common`
        are only those every rank shares) and the two FIFOs of its output; the command."""
        envs = {spec.rank: self._rank_env(start, spec, run) for spec in specs}
        differing = {k for env in envs.values() for k, v in env.items() if common.get(k) != v}
        for key in differing:
            common.pop(key, None)
        ranks_dir = run.work_dir / ".ranks"
        ranks_dir.mkdir(exist_ok=True)
        user = self._user(run)
        for rank, env in envs.items():
            own = {k: v for k, v in env.items() if k in differing}
            (ranks_dir / f"{rank}.env").write_text(containers.env_file_text(own))
            for stream in ("out", "err"):
                os.mkfifo(ranks_dir / f"{rank}.{stream}", 0o600)
        if user is not None:
            rank_user.chown_tree(ranks_dir, user)
        return containers.group_argv(str(ranks_dir), sorted(envs), list(start.argv))

    async def _guard_containers(self, run: AllocationRun) -> None:
        """Wait until each rank's container runs (they start in parallel) and hand its
        first process to the fence: its SIGKILL ends the container's every process, which
        killing the runtime's client would not."""
        private = self._container_dir(run)
        first_rank: dict[int, int] = {}  # a client's pid -> the rank its pid file is named by
        for rank, client in sorted(run.processes.items()):
            first_rank.setdefault(client.pid, rank)
        clients = {client.pid: client for client in run.processes.values()}
        assert self.runtime is not None
        pids = await asyncio.gather(
            *(
                containers.container_pid(self.runtime, private / f"{first_rank[pid]}.id", client)
                for pid, client in clients.items()
            )
        )
        found = dict(zip(clients, pids, strict=True))
        for rank, client in run.processes.items():
            pid = found[client.pid]
            if pid is not None:
                run.container_pids[rank] = pid
        if self.fence is not None:
            for pid in {p for p in found.values() if p is not None}:
                self.fence.guard(pid)

    def _agent_env(self) -> dict[str, str]:
        """The runtime client's environment: the agent's, less its own settings."""
        return {
            k: v
            for k, v in os.environ.items()
            if not k.upper().startswith("DET_") and not any(s and s in v for s in self.withheld)
        }

    def _container_dir(self, run: AllocationRun) -> Path:
        """The rank containers' env files and pid files: root's alone, outside what the
        ranks see."""
        return self.work_dir / "containers" / run.allocation_id

    def _rank_env(
        self, start: pb.StartAllocation, spec: pb.RankSpec, run: AllocationRun
    ) -> dict[str, str]:
        # The agent's own DET_* settings (its join token above all) never reach user code;
        # pydantic-settings reads them in any case (det_agent_join_token), so drop those too,
        # and anything else that holds a withheld value.
        in_image = run.container is not None
        rank = self._user(run)
        if in_image:
            # The image's own environment (its PATH above all), and the rank's variables.
            env: dict[str, str] = {}
            if rank is not None:
                inside = bootstrap.WORKDIR if run.per_agent else run.work_dir
                env.update(HOME=str(inside), USER=rank.name, LOGNAME=rank.name)
        else:
            env = self._agent_env()
            # `python3` in an entrypoint is the interpreter the agent runs on, with its
            # packages.
            env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
            if rank is not None:
                # Not root's home and name: a home the rank user can write (caches,
                # ~/.config), the same path inside a per-agent namespace as outside.
                name = rank.name
                env.update(HOME=str(run.work_dir), USER=name, LOGNAME=name)
        env.update(start.env)
        devices = [self.devices[s] for s in spec.slot_ids if s in self.devices]
        if in_image:  # a container numbers its GPUs from 0; their UUIDs name them anywhere
            gpus = [d.uuid or str(d.index) for d in devices if d.type == "cuda"]
        else:
            gpus = [str(d.index) for d in devices if d.type == "cuda"]
        if not run.per_agent:  # Determined's launchers set these for the ranks they start
            env.update(
                {
                    "RANK": str(spec.rank),
                    "LOCAL_RANK": str(spec.local_rank),
                    "LOCAL_WORLD_SIZE": str(len(start.ranks)),
                    "LOCAL_SIZE": str(len(start.ranks)),
                }
            )
        env.update(
            {
                "DET_AGENT_ID": self.agent_id,
                "DET_SLOT_IDS": json.dumps(list(spec.slot_ids)),
                "DET_CONTAINER_ID": f"{start.allocation_id}.{spec.rank}",
                "DET_RESOURCES_ID": f"{start.allocation_id}.{self.agent_id}",
                "DET_WORKDIR": str(bootstrap.WORKDIR if run.per_agent else run.work_dir),
                # CPU slots see no GPU, so a CPU trial never grabs one by accident.
                "CUDA_VISIBLE_DEVICES": ",".join(gpus),
                # NVML numbers GPUs in PCI bus order; make CUDA agree, or a rank may be
                # handed another rank's GPU.
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "PYTHONUNBUFFERED": "1",
            }
        )
        if self.master_cert_file is not None:
            where = bootstrap.MASTER_CERT if run.per_agent else run.work_dir / MASTER_CERT
            env["DET_MASTER_CERT_FILE"] = str(where)
            if self.master_cert_name:
                env["DET_MASTER_CERT_NAME"] = self.master_cert_name
            # requests lets these beat the bundle Determined's harness builds from
            # DET_MASTER_CERT_FILE, so the agent's own are not handed down (an experiment's are).
            for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
                if name not in start.env:
                    env.pop(name, None)
        return env

    async def _pump(
        self, run: AllocationRun, rank: int, stream: asyncio.StreamReader, stdtype: str
    ) -> None:
        pending = b""
        while True:
            chunk = await stream.read(MAX_LINE)
            pending += chunk
            lines = pending.split(b"\n")
            pending = lines.pop()
            # The stream ended without a final newline, or a line never ends (progress bars).
            if (pending and not chunk) or len(pending) >= MAX_LINE:
                lines.append(pending)
                pending = b""
            for line in lines:
                line_rank = rank
                if run.grouped and stdtype == "stdout":
                    ended = containers.parse_rank_exit(line)
                    if ended is not None:
                        exit_status = run.rank_exits.get(ended[0])
                        if exit_status is not None and not exit_status.done():
                            exit_status.set_result(containers.signal_exit(ended[1]))
                        continue
                if run.per_agent:
                    # A launcher's own lines belong to no rank; its ranks say which they are.
                    tagged = RANK_PREFIX.match(line)
                    line_rank = int(tagged.group(1)) if tagged else -1
                    if tagged:
                        line = line[tagged.end() :]
                self.logs(
                    pb.LogEntry(
                        allocation_id=run.allocation_id,
                        rank=line_rank,
                        stdtype=stdtype,
                        unix_micros=time.time_ns() // 1000,
                        message=line.decode("utf-8", errors="replace") + "\n",
                    )
                )
            if not chunk:
                return

    async def _watch(
        self, run: AllocationRun, rank: int, process: asyncio.subprocess.Process
    ) -> None:
        if run.grouped:
            code = await run.rank_exits[rank]  # the container runs on for the other ranks
        else:
            code = await process.wait()
            if run.container is not None:
                code = containers.signal_exit(code)
            if self.fence is not None:
                self.fence.release(process.pid)
                if rank in run.container_pids:
                    self.fence.release(run.container_pids[rank])
        run.exit_codes[rank] = code
        fenced = (
            code < 0
            and self.fence is not None
            and self.fence.lapsed_since(run.started_at)
            and run.kind in (pb.EXIT_KIND_UNSPECIFIED, pb.EXIT_KIND_FENCED)
        )
        if fenced and run.kind == pb.EXIT_KIND_UNSPECIFIED:
            run.kind, run.message = pb.EXIT_KIND_FENCED, FENCED_MESSAGE
            self._note(run, rank, f"rank {rank} killed by the fence: {run.message}")
            run.stopping = True
            self.spawn_task(self._stop_processes(run))
        elif code != 0 and not run.stopping and run.kind == pb.EXIT_KIND_UNSPECIFIED:
            run.kind = pb.EXIT_KIND_FAILED
            # per_agent: one process per agent runs the launcher, which starts the ranks.
            who = f"the entrypoint (container rank {rank})" if run.per_agent else f"rank {rank}"
            run.message = f"{who} exited with code {code}"
            self._note(run, rank, f"{run.message}; stopping the other ranks")
            run.stopping = True
            self.spawn_task(self._stop_processes(run))
        if len(run.exit_codes) == len(run.processes):
            await self._finish(run)

    async def _watch_group(self, run: AllocationRun, client: asyncio.subprocess.Process) -> None:
        """A grouped run's container has ended: a rank that did not say how it ended was
        killed with it."""
        code = containers.signal_exit(await client.wait())
        ranks_dir = run.work_dir / ".ranks"
        for rank, exit_status in run.rank_exits.items():
            if not exit_status.done():  # its line was lost: the file, else killed with it
                written = _read_int(ranks_dir / f"{rank}.exit")
                if written is not None:
                    written = containers.signal_exit(written)
                exit_status.set_result(written if written is not None else code or -9)
        _release_readers(ranks_dir)
        if self.fence is not None:
            self.fence.release(client.pid)
            for pid in set(run.container_pids.values()):
                self.fence.release(pid)

    async def _pump_fifo(self, run: AllocationRun, rank: int, fifo: Path, stdtype: str) -> None:
        """A grouped rank's stdout or stderr, from the FIFO its launcher writes."""
        # open() waits for the writer; a container that never opens it is released by
        # _watch_group once it ended.
        descriptor = await asyncio.to_thread(os.open, fifo, os.O_RDONLY)
        reader = asyncio.StreamReader(limit=MAX_LINE)
        transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(descriptor, "rb", buffering=0)
        )
        try:
            await self._pump(run, rank, reader, stdtype)
        finally:
            transport.close()

    async def _stop_processes(self, run: AllocationRun) -> None:
        alive = {r: p for r, p in run.processes.items() if r not in run.exit_codes}
        for rank, process in alive.items():
            self._signal_rank(run, rank, process, signal.SIGTERM)
        if alive:
            await asyncio.wait(
                [asyncio.ensure_future(p.wait()) for p in alive.values()], timeout=run.grace_s
            )
        for rank, process in alive.items():
            if process.returncode is None:
                self._signal_rank(run, rank, process, signal.SIGKILL)

    def _signal_rank(
        self,
        run: AllocationRun,
        rank: int,
        process: asyncio.subprocess.Process,
        sig: signal.Signals,
    ) -> None:
        """A rank's process group; in a container, its first process (whose SIGKILL ends
        the container), while its client still runs (until then the pid is surely its)."""
        pid = run.container_pids.get(rank)
        if pid is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
            if sig == signal.SIGTERM:
                return  # the client ends with its container
        _signal_group(process, sig)

    async def _finish(self, run: AllocationRun) -> None:
        if run.allocation_id not in self.runs or run.finishing:
            return
        run.finishing = True
        if run.grouped:  # a launcher that never ran leaves the FIFOs' readers waiting
            _release_readers(run.work_dir / ".ranks")
        # Let the log pumps drain what the ranks wrote last.
        pumps = [t for t in run.tasks if t is not asyncio.current_task()]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*pumps, return_exceptions=True), 5.0)
        # A rank's own children (data loader workers, a shell's jobs) must not outlive it.
        for process in run.processes.values():
            _signal_group(process, signal.SIGKILL)
        if run.container is not None and self.runtime is not None:
            # Before the master hears of the exit (nothing of it may still run then), and
            # while the run is still known here, so a stop or a Hello meanwhile sees it.
            try:
                await asyncio.wait_for(
                    containers.remove_allocation(self.runtime, run.allocation_id),
                    REMOVE_TIMEOUT_S,
                )
            except (OSError, TimeoutError) as exc:
                log.warning("allocation %s: its containers not removed: %r", run.allocation_id, exc)
            await asyncio.to_thread(shutil.rmtree, self._container_dir(run), True)
        del self.runs[run.allocation_id]
        self.ports.pop(run.allocation_id, None)
        if run.kind == pb.EXIT_KIND_UNSPECIFIED:
            run.kind = pb.EXIT_KIND_COMPLETED
        exited = pb.AllocationExited(
            allocation_id=run.allocation_id,
            kind=run.kind,
            exits=[pb.RankExit(rank=r, exit_code=c) for r, c in sorted(run.exit_codes.items())],
            message=run.message,
        )
        self._remember_exit(exited)
        log.info(
            "allocation %s: every local rank exited (%s) %s",
            run.allocation_id,
            pb.ExitKind.Name(run.kind),
            run.message,
        )
        await asyncio.to_thread(shutil.rmtree, run.work_dir, True)
        await asyncio.to_thread(shutil.rmtree, self._secrets_dir(run), True)
        if run.rank is not None and run.checkpoints is not None:
            await asyncio.to_thread(self._seal, run, run.rank, run.checkpoints)
        if self.rank_uids is not None:  # its files are gone: the uid may serve another run
            self.rank_uids.release(run.allocation_id)

    def _user(self, run: AllocationRun) -> RankUser | None:
        """Whom `run`'s processes run as: its own uid, else rank_user (None: the agent's)."""
        return run.rank if run.rank is not None else self.rank_user

    def _seal(self, run: AllocationRun, rank: RankUser, store: Path) -> None:
        """What the run wrote in its shared_fs store becomes the store's owner's (root, or
        the user an admin gave the store to, such as the master's on a shared file system,
        which then reads and deletes it), never a uid of the range."""
        try:
            owner = store.stat().st_uid
        except OSError:
            return
        pool = self.rank_uids
        if pool is not None and pool.first <= owner <= pool.last:
            owner = 0
        sealed = rank_user.seal_checkpoints(store, rank.uid, owner)
        if sealed:
            log.info(
                "allocation %s: %d checkpoint(s) in %s given to uid %d, group kept",
                run.allocation_id,
                sealed,
                store,
                owner,
            )

    def _umask(self, run: AllocationRun) -> int:
        """A run with a uid of its own writes files only its owner's group may read;
        others keep the agent's umask (-1: unchanged)."""
        return rank_user.RANK_UMASK if run.rank is not None else -1

    def _switch(self, run: AllocationRun) -> list[str]:
        """setpriv's command prefix that drops to the run's user; empty without one."""
        rank = self._user(run)
        if rank is None:
            return []
        return rank_user.command([], setpriv=SETPRIV, rank=rank)

    def _hand_over(self, run: AllocationRun) -> None:
        """Give the run's directory to its ranks: the rank user's alone (0700). Its parent
        lets them pass but not list the other allocations."""
        run.work_dir.chmod(0o700)
        rank = self._user(run)
        if rank is not None:
            run.work_dir.parent.chmod(0o711)
            rank_user.chown_tree(run.work_dir, rank)

    def _secrets_dir(self, run: AllocationRun) -> Path:
        return self.work_dir / "secrets" / run.allocation_id

    def _note(self, run: AllocationRun, rank: int, message: str) -> None:
        """A line in the trial's logs from the agent itself."""
        self.logs(
            pb.LogEntry(
                allocation_id=run.allocation_id,
                rank=rank,
                stdtype="agent",
                unix_micros=time.time_ns() // 1000,
                message=f"[agent {self.agent_id}] {message}\n",
            )
        )


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _release_readers(ranks_dir: Path) -> None:
    """Open and close each FIFO's writing end, so a reader still waiting in open() (the
    container ended before its launcher opened it) reads an end instead of waiting on; a
    reader that has its writer loses nothing."""
    for fifo in [*ranks_dir.glob("*.out"), *ranks_dir.glob("*.err")]:
        with contextlib.suppress(OSError):  # no reader waits (ENXIO), or the FIFO is gone
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def _signal_group(process: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def shared_fs_host_path(env: Mapping[str, str]) -> Path | None:
    """The host_path of a trial's shared_fs store, read from its config; None for another
    store or no config."""
    directory = shared_fs_directory(env)
    if directory is None:
        return None
    config = json.loads(env[storage_secrets.CONFIG_VARIABLE])
    return Path(config["checkpoint_storage"]["host_path"])


def shared_fs_directory(env: Mapping[str, str]) -> Path | None:
    """Where a trial's shared_fs checkpoints go on this agent (host_path, and storage_path
    inside it), read from its config; None for another store or no config."""
    try:
        config = json.loads(env.get(storage_secrets.CONFIG_VARIABLE, ""))
    except ValueError:
        return None
    storage = config.get("checkpoint_storage") if isinstance(config, dict) else None
    if not isinstance(storage, dict) or storage.get("type") != "shared_fs":
        return None
    host_path = storage.get("host_path")
    if not isinstance(host_path, str) or not host_path:
        return None
    storage_path = storage.get("storage_path")
    # The master checked that an absolute storage_path lies inside host_path.
    return Path(host_path) / storage_path if isinstance(storage_path, str) else Path(host_path)


def _lay_out_determined(
    start: pb.StartAllocation,
    work_dir: Path,
    gpu_uuids: list[str],
    master_cert_file: Path | None = None,
    master_cert_name: str | None = None,
) -> str | None:
    shared = start.shared_fs_host_path
    if shared:
        try:
            Path(shared).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return (
                f"checkpoint_storage.host_path {shared} does not exist on this agent and "
                f"cannot be created: {exc.strerror}"
            )
    run_dir = work_dir / "run"
    _unpack(start.model_definition, run_dir / "workdir")
    _unpack(start.model_definition, run_dir / "train" / "model")
    bootstrap.write_info(
        run_dir, dict(start.info_files), gpu_uuids, master_cert_file, master_cert_name
    )
    return None


def _unpack(archive: bytes, target: Path) -> None:
    """Unpack the model definition. The master checked every path already; the "data"
    filter checks again here (absolute paths, "..", links leaving the directory, devices)."""
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    if not archive:
        return
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            tar.extractall(target, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise LaunchFailed(f"the model definition cannot be unpacked: {exc}") from None
