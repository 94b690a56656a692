"""Core API metrics: a training metric every step, a validation metric every 10 steps.

Runs on a cluster (`entrypoint: python3 metrics.py`) or, without one, in Determined's local
mode, where the reports are only logged.
"""

import argparse
import logging
import time

import determined as det


def train(core_context: det.core.Context, steps: int, sleep: float) -> None:
    x = 0.0
    for step in range(1, steps + 1):
        time.sleep(sleep)  # stands in for a batch of real work
        x = 0.5 * x + step
        core_context.train.report_training_metrics(
            steps_completed=step, metrics={"x": x, "loss": 1.0 / step}
        )
        if step % 10 == 0:
            core_context.train.report_validation_metrics(steps_completed=step, metrics={"x": x})
        core_context.train.report_progress(step / steps)
    if det.get_cluster_info() is not None:  # the run's metadata lives on the master
        core_context.train.set_metadata({"steps": steps, "final": {"x": x}})
    print(f"DONE steps={steps} x={x!r}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--sleep", type=float, default=0.05, help="seconds per step")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    with det.core.init() as core_context:
        train(core_context, args.steps, args.sleep)
