"""Non-finite metrics: validation reports whose values are NaN and +/-infinity.

Determined's client sends them as the JSON strings "NaN", "Infinity" and "-Infinity".
"""

import logging
import math

import determined as det

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    with det.core.init() as core_context:
        train = core_context.train
        train.report_training_metrics(steps_completed=1, metrics={"loss": 1.0})
        train.report_validation_metrics(
            steps_completed=1, metrics={"loss": math.nan, "accuracy": 0.5}
        )
        train.report_validation_metrics(
            steps_completed=2, metrics={"loss": math.inf, "accuracy": -math.inf}
        )
        print("REPORTED nan and inf", flush=True)
