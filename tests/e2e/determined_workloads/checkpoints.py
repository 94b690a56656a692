"""Core API checkpoints and preemption.

A checkpoint (a state file holding x and the step count) every 10 steps; a restarted or
resumed trial carries on from `latest_checkpoint`. Every step asks whether the master wants
the trial to stop; if so, it checkpoints and returns, and the trial resumes later.

Each step prints one line, `STEP n x=<repr>`, so a reader of the logs can check that no step
ran twice and that the final x equals an uninterrupted run's.
"""

import argparse
import json
import logging
import pathlib
import time

import determined as det


def save(core_context: det.core.Context, x: float, steps: int) -> None:
    with core_context.checkpoint.store_path({"steps_completed": steps}) as (path, uuid):
        (pathlib.Path(path) / "state.json").write_text(json.dumps({"x": x, "steps": steps}))
    print(f"CHECKPOINT {uuid} steps={steps}", flush=True)


def load(core_context: det.core.Context, uuid: str) -> tuple[float, int]:
    with core_context.checkpoint.restore_path(uuid) as path:
        state = json.loads((pathlib.Path(path) / "state.json").read_text())
    return state["x"], state["steps"]


def train(core_context: det.core.Context, latest: str | None, steps: int, sleep: float) -> None:
    x, done = 0.0, 0
    if latest is not None:
        x, done = load(core_context, latest)
        print(f"RESUMED {latest} steps={done} x={x!r}", flush=True)
    for step in range(done + 1, steps + 1):
        time.sleep(sleep)
        x += 1.0 / step  # a harmonic sum: a step skipped or run twice changes the result
        print(f"STEP {step} x={x!r}", flush=True)
        core_context.train.report_training_metrics(steps_completed=step, metrics={"x": x})
        saved = step % 10 == 0
        if saved:
            core_context.train.report_validation_metrics(steps_completed=step, metrics={"x": x})
            save(core_context, x, step)
        core_context.train.report_progress(step / steps)
        if core_context.preempt.should_preempt():
            if not saved:
                save(core_context, x, step)
            print(f"PREEMPTED steps={step}", flush=True)
            return
    print(f"DONE steps={steps} x={x!r}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--sleep", type=float, default=0.05, help="seconds per step")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()  # None off-cluster: start from scratch
    latest = info.latest_checkpoint if info is not None else None
    with det.core.init() as core_context:
        train(core_context, latest, args.steps, args.sleep)
