"""A trial that launches its own workers, one per slot, and talks to them over Core API.

    python3 distributed_launcher.py launcher                   # the entrypoint, once per agent
    python3 distributed_launcher.py worker RANK LOCAL_RANK     # started by the launcher

Workers build a `det.core.DistributedContext` from the cluster info (slot ids, container
addresses and rank) and allgather every step; the chief reports what they gathered.
"""

import argparse
import logging
import signal
import subprocess
import sys
import time

import determined as det

STEPS = 20


def launcher(info: det.ClusterInfo) -> int:
    slots = len(info.slot_ids)
    first_rank = info.container_rank * slots
    workers = []
    for local_rank in range(slots):
        rank = first_rank + local_rank
        command = ["python3", "-m", "determined.launch.wrap_rank", str(rank), "--"]
        command += ["python3", __file__, "worker", str(rank), str(local_rank)]
        workers.append(subprocess.Popen(command))

    def forward(signum: int, _frame: object) -> None:  # a pause or a kill reaches every worker
        for worker in workers:
            worker.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    # Wait for every worker; when one fails, stop the others so none hangs in a collective.
    while True:
        codes = [worker.poll() for worker in workers]
        failed = [code for code in codes if code not in (None, 0)]
        if failed:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                worker.wait()
            return failed[0]
        if all(code == 0 for code in codes):
            return 0
        time.sleep(0.1)


def worker(info: det.ClusterInfo, rank: int, local_rank: int) -> None:
    slots, nodes = len(info.slot_ids), len(info.container_addrs)
    distributed = det.core.DistributedContext(
        rank=rank,
        size=slots * nodes,
        local_rank=local_rank,
        local_size=slots,
        cross_rank=info.container_rank,
        cross_size=nodes,
        chief_ip=info.container_addrs[0],
    )
    with det.core.init(distributed=distributed) as core_context:
        for step in range(1, STEPS + 1):
            ranks = core_context.distributed.allgather(rank)
            time.sleep(0.05)
            if rank == 0:
                print(f"ALLGATHER step={step} ranks={ranks}", flush=True)
                core_context.train.report_training_metrics(
                    steps_completed=step, metrics={"rank_sum": sum(ranks), "size": len(ranks)}
                )
            if core_context.preempt.should_preempt():
                return
        if rank == 0:
            size = core_context.distributed.size
            core_context.train.report_validation_metrics(
                steps_completed=STEPS, metrics={"size": size}
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("role", choices=["launcher", "worker"])
    parser.add_argument("rank", type=int, nargs="?")
    parser.add_argument("local_rank", type=int, nargs="?")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    cluster_info = det.get_cluster_info()
    if cluster_info is None:
        sys.exit("distributed_launcher.py runs only on a cluster (no cluster info found)")
    if args.role == "launcher":
        sys.exit(launcher(cluster_info))
    if args.rank is None or args.local_rank is None:
        parser.error("worker needs RANK and LOCAL_RANK")
    worker(cluster_info, args.rank, args.local_rank)
