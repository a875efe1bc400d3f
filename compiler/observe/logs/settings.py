"""The job settings a framework prints at start-up, read so the log can describe itself and be
checked against the job lmspec was told about.

Formats: NVIDIA/Megatron-LM `megatron/training/arguments.py::_print_args`
(``  seq_length ...................................... 4096``, dots to column 48) and
deepspeedai/DeepSpeed `deepspeed/utils/logging.py::print_configuration`
(``  train_batch_size ............. 16``, dots to column 29, none for longer names).
"""

from __future__ import annotations

import re

from lmspec.compiler.observe.metrics_record import digits_int

# printed name -> lmspec's name for it
_NAMES: dict[str, str] = {
    "seq_length": "seq_length",
    "global_batch_size": "global_batch_size",
    "train_batch_size": "global_batch_size",
    "micro_batch_size": "micro_batch_size",
    "train_micro_batch_size_per_gpu": "micro_batch_size",
    "world_size": "world_size",
    "tensor_model_parallel_size": "tp",
    "pipeline_model_parallel_size": "pp",
}
_SETTING = re.compile(r"(?:^|\s)(" + "|".join(_NAMES) + r") \.*\s*(\d+)\s*$")


def parse_setting(text: str) -> tuple[str, int] | None:
    """(lmspec name, value) from a start-up printout line, else None."""
    if " .." not in text and "_per_gpu " not in text:  # the printouts' dot leaders; cheap pre-check
        return None
    match = _SETTING.search(text)
    value = digits_int(match.group(2)) if match else None
    return (_NAMES[match.group(1)], value) if match and value is not None else None
