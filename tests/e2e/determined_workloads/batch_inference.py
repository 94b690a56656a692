"""Batch inference as Determined's documentation has it: inside the trial, the SDK reads the
model version to serve from the registry, the trial says it uses that version, and its
inference metrics are reported in a group of their own, to be found from the version.

`--model NAME` names the registered model (its latest version is served)."""

import argparse
import logging

import determined as det
from determined.experimental import client

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    with det.core.init() as core_context:
        version = client.get_model(args.model).get_version()
        core_context.experimental.report_task_using_model_version(version)
        for batch in range(1, 4):
            core_context.train.report_metrics(
                "inference", steps_completed=batch, metrics={"predictions": 64 * batch}
            )
        print(f"SERVED {args.model} version {version.model_version}", flush=True)
