"""A toy search for the ASHA walkthrough: the `resolute` library, no torch, seconds per
trial. The "validation loss" falls at a rate set by `lr`, with a floor set by `width`; the
searcher keeps training the trials whose loss is lowest at each rung and stops the rest
(the preemption signal, which `should_preempt()` reads).
"""

import math
import time

import resolute

with resolute.init() as ctx:
    lr, width = ctx.hparams["lr"], ctx.hparams["width"]
    length = ctx.max_length or 64  # the searcher's max_time, in batches
    for step in range(ctx.steps_completed + 1, length + 1):
        time.sleep(0.01)  # a "batch"
        loss = 1 / (1 + lr * step) + 1 / width + 0.01 * math.sin(step)
        ctx.train.report_training_metrics(steps_completed=step, metrics={"loss": loss})
        if step % 4 == 0:
            ctx.train.report_validation_metrics(
                steps_completed=step, metrics={"validation_loss": loss}
            )
            if ctx.preempt.should_preempt():  # stopped by the searcher (or paused)
                break
