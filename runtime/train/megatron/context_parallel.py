"""Each context-parallel rank's share of a micro-batch, split as Megatron-LM's pretrain_gpt splits it.

With cp > 1 every rank of a CP group holds the same micro-batch and attends over the whole
sequence through Transformer Engine's ring attention (cp_comm_type p2p), but computes on
2 of its 2*cp chunks: chunks r and 2*cp-1-r, so each rank's share of causal attention work is equal
(megatron.core.utils.get_batch_on_this_cp_rank). Tokens, labels and position ids are split alike
(RoPE is sliced the same way inside megatron-core). Each rank's loss is its own tokens' sum over
its own token count; the gradient mean over the DP x CP group then weights every token alike, and
the reported loss sums loss and tokens over all ranks, as Megatron-LM's loss_func and schedule do.
"""

from __future__ import annotations

from typing import Any

import torch


def this_rank_share(
    tokens: torch.Tensor, labels: torch.Tensor, position_ids: torch.Tensor, cp_group: Any = None
) -> dict[str, torch.Tensor]:
    """{tokens, labels, position_ids} [b, s/cp] of this CP rank (the CP group of megatron's
    parallel_state unless `cp_group` is given); the inputs themselves when cp = 1."""
    from megatron.core.utils import get_batch_on_this_cp_rank

    batch = {"tokens": tokens, "labels": labels, "position_ids": position_ids.contiguous()}
    return get_batch_on_this_cp_rank(batch, cp_group=cp_group)
