"""Core API hyperparameter search: a toy quantity that grows by `step_size` per batch; the
searcher keeps the trials where it grows slowest. Checkpoints every validation and stops
when the master says so, as Determined's Core API tutorials do.
"""

import logging
import pathlib
import time

import determined as det


def restore(core_context: det.core.Context, checkpoint: str | None) -> tuple[int, int]:
    if checkpoint is None:
        return 0, 0
    with core_context.checkpoint.restore_path(checkpoint) as path:
        total, batches = (int(v) for v in (pathlib.Path(path) / "state").read_text().split())
    return total, batches


def main(core_context: det.core.Context, info: det.ClusterInfo) -> None:
    assert info.trial is not None
    step_size = info.trial.hparams["step_size"]
    max_time = info.trial._config["searcher"]["max_time"]
    total, batches = restore(core_context, info.latest_checkpoint)
    while batches < max_time:
        time.sleep(0.05)
        batches += 1
        total += step_size
        if batches % 10:
            continue
        core_context.train.report_training_metrics(
            steps_completed=batches, metrics={"total": total}
        )
        core_context.train.report_validation_metrics(
            steps_completed=batches, metrics={"total": total, "batches": batches}
        )
        with core_context.checkpoint.store_path({"steps_completed": batches}) as (path, _):
            (path / "state").write_text(f"{total} {batches}")
        if core_context.preempt.should_preempt():
            print(f"PREEMPTED at batches={batches}", flush=True)
            return
    print(f"TRAINED batches={batches}", flush=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    cluster_info = det.get_cluster_info()
    assert cluster_info is not None, "runs on a cluster only"
    with det.core.init() as context:
        main(context, cluster_info)
