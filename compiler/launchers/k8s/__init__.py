"""What the Kubernetes launcher shares with the runtime: its objects' names, how they are written as YAML, and
the build ConfigMap (k8s/build.yaml), which `lmspec run` makes again from the build it applies.

The rest of the objects (the pods, TrainJob, JobSet, LeaderWorkerSet, RayService) are emitted by
lmspec.compiler.emit.k8s, which the runtime may not import (lmspec.compiler.contract); this package imports no
emitter, so both may use it.
"""
