"""The sizes of DeepSpeed's ZeRO buffers lmspec writes into ds_config.json, read by its emitter and by the
memory estimate (compiler/models/train_memory.py prices what each allocates), so the two never differ.

- The reduce (and ZeRO-1/2 all-gather) bucket: h^2 elements, as transformers' DeepSpeed integration
  sizes it for "auto". The gradient-reduction bucket is allocated in the model's dtype, twice under
  overlap_comm (stage_1_and_2.py double-buffers it), once under ZeRO-3 (stage3.py's ipg bucket).
- ZeRO-3's parameter coordinator keeps a gathered parameter until more than `stage3_max_live_parameters`
  are live or its next use is more than `stage3_max_reuse_distance` elements away: DeepSpeed's defaults
  (1e9 each), written out so a reviewer sees that a model under a billion parameters per GPU stays
  gathered from the forward into the backward.
- ZeRO-3's optimizer step runs one `sub_group_size` of the partition at a time (DeepSpeed's default, 1e9);
  ZeRO-0's gradient all-reduce flattens up to 5e8 elements at a time (a DeepSpeed constant).
"""

from __future__ import annotations

ZERO3_MAX_LIVE_PARAMETERS = 10**9
# ZeRO-3 steps the optimizer one sub-group of its partition at a time (DeepSpeed's default, written out)
ZERO3_SUB_GROUP_ELEMENTS = 10**9
# ZeRO-0's gradient all-reduce flattens up to this many elements at once (deepspeed.runtime.constants
# MEMORY_OPT_ALLREDUCE_SIZE, not a ds_config key)
ALLREDUCE_FLAT_ELEMENTS = 500_000_000
ZERO3_MAX_REUSE_DISTANCE = 10**9
# transformers' integration: prefetch bucket = 0.9 h^2, persistence threshold = 10 h (elements).
ZERO3_PREFETCH_FRACTION = 0.9
ZERO3_PERSISTENCE_PER_HIDDEN = 10


def bucket_elements(hidden: int) -> int:
    """reduce_bucket_size (and allgather_bucket_size) in elements."""
    return hidden * hidden
