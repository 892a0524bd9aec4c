"""hpctrain memory: predict what a training step holds per device, measure it, find the batch
that fits, and turn the numbers into a parallelism decision."""
