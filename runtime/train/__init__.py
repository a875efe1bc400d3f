"""The train stage: the launch, the loop, data, checkpoints, metrics; one sub-package per backend."""
