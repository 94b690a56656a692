"""The agent protocol's messages to and from the master's own types: what an agent's Hello
registers, what its metric samples become, and the small messages the hub sends back.
No I/O and no state, so the hub's logic reads in the master's terms."""

from __future__ import annotations

from master.services import agents as agent_service
from master.services import metrics as metric_service
from resolute_proto.agent.v1 import agent_pb2 as pb


def registration_of(hello: pb.Hello, default_pool: str) -> agent_service.AgentRegistration:
    return agent_service.AgentRegistration(
        id=hello.agent_id,
        resource_pool=hello.resource_pool or default_pool,
        devices=tuple(
            agent_service.Device(
                slot_id=d.slot_id,
                type=d.type,
                brand=d.brand,
                uuid=d.uuid,
                memory_bytes=d.memory_bytes or None,
            )
            for d in hello.devices
        ),
        addresses=tuple(sorted({a for i in hello.interfaces for a in i.ipv4})),
        version=hello.version,
        hostname=hello.hostname,
    )


def interfaces_of(hello: pb.Hello) -> list[dict[str, object]]:
    """The agent's network interfaces as AgentModel.interfaces stores them."""
    return [{"name": i.name, "ipv4": list(i.ipv4)} for i in hello.interfaces]


def reading_of(sample: pb.MetricSample) -> metric_service.MetricReading:
    return metric_service.MetricReading(
        unix_millis=sample.unix_millis,
        cpu_util_simple=sample.cpu_util_simple,
        memory_free=sample.memory_free,
        memory_used=sample.memory_used,
        disk_throughput_read=sample.disk_throughput_read,
        disk_throughput_write=sample.disk_throughput_write,
        disk_iops=sample.disk_iops,
        net_throughput_sent=sample.net_throughput_sent,
        net_throughput_recv=sample.net_throughput_recv,
        gpus=tuple(
            metric_service.GpuReading(
                index=g.index,
                uuid=g.uuid,
                gpu_util=g.gpu_util,
                gpu_memory_used=g.gpu_memory_used,
                gpu_free_memory=g.gpu_free_memory,
                temperature_c=g.temperature_c,
                power_w=g.power_w,
            )
            for g in sample.gpus
        ),
    )


def heartbeat_ack(heartbeat: pb.Heartbeat) -> pb.MasterMessage:
    return pb.MasterMessage(
        heartbeat_ack=pb.HeartbeatAck(seq=heartbeat.seq, sent_unix_nanos=heartbeat.sent_unix_nanos)
    )


def exit_ack(allocation_id: str) -> pb.MasterMessage:
    return pb.MasterMessage(exit_ack=pb.ExitAck(allocation_id=allocation_id))


def stop(allocation_id: str, reason: str, grace_s: float) -> pb.MasterMessage:
    return pb.MasterMessage(
        stop=pb.StopAllocation(allocation_id=allocation_id, reason=reason, grace_s=grace_s)
    )


def exit_code(exits: list[pb.AllocationExited]) -> int | None:
    """The first nonzero exit code of the processes, else 0; None if none exited (a lost
    agent, a start that never happened)."""
    codes = [e.exit_code for exited in exits for e in exited.exits]
    if not codes:
        return None
    return next((c for c in codes if c != 0), 0)
