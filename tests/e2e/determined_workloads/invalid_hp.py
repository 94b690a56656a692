"""A trial that finds its hyperparameters unusable: one metric, then det.InvalidHP.

`det.core.init()`'s context manager catches InvalidHP, tells the master (early exit with
reason INVALID_HP) and exits 0, so the trial ends without counting as a failure.
"""

import logging

import determined as det

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    with det.core.init() as core_context:
        core_context.train.report_training_metrics(steps_completed=1, metrics={"loss": 4.0})
        print("RAISING InvalidHP", flush=True)
        raise det.InvalidHP("loss diverged: this learning rate is too large")
