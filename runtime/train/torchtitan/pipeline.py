"""Pipeline parallelism as torchtitan runs it: stages of a transformers causal LM under torch.distributed.pipelining.

torchtitan's `pipeline_llm` deep-copies the whole model once per stage this rank holds, deletes what the
stage does not run (`pipeline_module_split`), wraps each part in a PipelineStage and builds the schedule
named by `parallelism.pipeline_parallel_schedule` (`build_pipeline_schedule`: micro-batches of
`pipeline_parallel_microbatch_size`, the loss of each divided by their count, `scale_grads=False`). Here
the same on transformers' modeling code: a `Stage` keeps the causal LM's own `model` (the decoder layers it
runs in a ModuleDict keyed by their global index, the embedding on the first stage, the final norm on the
last) and `lm_head` (last stage), so its state dict names are the whole model's (`model.layers.5.mlp...`)
and a DCP save of any pipeline layout loads at any other, converts and imports by HF names.

Stage s of S runs on pipeline rank s mod pp ("looped" placement: 1F1B holds one stage per rank,
Interleaved1F1B v of them), as torchtitan places them and as Megatron orders its virtual chunks.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import PipelineScheduleMulti, _PipelineSchedule, get_schedule_class

from lmspec.runtime.train.data import Batch

_LAYER = re.compile(r"model\.layers\.(\d+)")
# what a stage may hold beside decoder layers (torchtitan's module_fqns_per_model_part, transformers' names)
EMBEDDING, NORM, HEAD = "model.embed_tokens", "model.norm", "lm_head"


class Stage(torch.nn.Module):
    """One pipeline stage of a transformers causal LM: its own modules under the whole model's names.

    Its forward is the causal LM's for these layers: positions 0..s-1, the causal mask transformers builds
    for the attention kernel (eager attention gets an explicit one), the rotary embedding, each decoder
    layer, and on the last stage the final norm and the head's logits. Under tensor parallelism (with
    sequence parallelism) a stage after the first receives its sequence shard, s / `sequence_split`
    positions, so the whole length is that times `sequence_split`."""

    def __init__(self, lm: torch.nn.Module, modules: Sequence[str], sequence_split: int) -> None:
        super().__init__()
        inner: Any = lm.get_submodule("model")  # transformers' <Family>Model: embed_tokens, layers, norm, rotary_emb
        layers = [int(m.group(1)) for name in modules if (m := _LAYER.fullmatch(name))]
        inner.layers = torch.nn.ModuleDict({str(i): inner.layers[i] for i in layers})
        self.first, self.last = EMBEDDING in modules, HEAD in modules
        if not self.first:
            inner.embed_tokens = None
        if not self.last:
            inner.norm = None
        self.model = inner
        self.lm_head = lm.get_submodule(HEAD) if self.last else None
        self.sequence_split = 1 if self.first else sequence_split

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_causal_mask

        inner: Any = self.model
        h = inner.embed_tokens(x) if self.first else x
        batch, length = h.shape[0], h.shape[1] * self.sequence_split
        positions = torch.arange(length, device=h.device).unsqueeze(0)
        # the mask reads the batch, length, dtype and device of the embeddings it is given: a stage past the
        # first under TP holds a sequence shard, so an empty tensor of the whole length stands for them
        mask = create_causal_mask(
            config=inner.config,
            inputs_embeds=h.new_empty((batch, length, 0)),
            attention_mask=None,
            past_key_values=None,
            position_ids=positions,
        )
        rotary = inner.rotary_emb(h, positions)
        for layer in inner.layers.values():
            h = layer(h, attention_mask=mask, position_ids=positions, position_embeddings=rotary, use_cache=False)
        if self.last:
            assert self.lm_head is not None
            h = self.lm_head(inner.norm(h))
        return h


def part_problems(parts: Sequence[Sequence[str]], num_layers: int) -> list[str]:
    """Why `parts` (module_fqns_per_model_part) is not a pipeline of this model: every decoder layer once and
    in order, at least one in each stage, the embedding first and the norm and head last; or nothing."""
    problems = []
    layers = [int(m.group(1)) for part in parts for name in part if (m := _LAYER.fullmatch(name))]
    if layers != list(range(num_layers)):
        problems.append(f"its stages hold layers {layers}, not 0..{num_layers - 1} once each in order")
    if empty := [s for s, part in enumerate(parts) if not any(_LAYER.fullmatch(name) for name in part)]:
        problems.append(f"stage(s) {empty} hold no decoder layer")
    others = [(s, name) for s, part in enumerate(parts) for name in part if not _LAYER.fullmatch(name)]
    if others != [(0, EMBEDDING), (len(parts) - 1, NORM), (len(parts) - 1, HEAD)]:
        problems.append(f"its other modules are {others}: {EMBEDDING} on the first stage, {NORM} and {HEAD} last")
    return problems


def split_model(
    lm: torch.nn.Module, parts: Sequence[Sequence[str]], pp_mesh: DeviceMesh, sequence_split: int
) -> list[tuple[int, Stage]]:
    """This pipeline rank's stages (stage index, module), each cut from its own copy of `lm`."""
    rank, pp = pp_mesh.get_local_rank(), pp_mesh.size()
    return [(s, Stage(copy.deepcopy(lm), parts[s], sequence_split)) for s in range(rank, len(parts), pp)]


class MicroBatchLoss:
    """The schedule's loss_fn: a micro-batch's token-mean cross-entropy divided by the step's micro-batch
    count (torchtitan's rescale_accumulated_loss; the non-pipelined step divides alike), so the losses a
    schedule returns sum to the step's mean, as torchtitan logs it. (The schedule also calls it once on
    stand-in tensors, in its first step's metadata inference: only the losses it returns count.)"""

    def __init__(self, micro_batches: int) -> None:
        self.micro_batches = micro_batches

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))
        return loss / self.micro_batches


@dataclass
class Pipeline:
    """This rank's stages under their schedule; `step` and `evaluate` return (loss sum, tokens) of the
    micro-batches whose loss this rank computed (none unless it holds the last stage)."""

    schedule: _PipelineSchedule
    loss: MicroBatchLoss
    first: bool  # holds the first stage: feeds the tokens
    last: bool  # holds the last stage: takes the labels, computes the losses
    device: torch.device

    def _run(self, batches: Sequence[Batch], run: Any) -> tuple[float, int]:
        tokens = torch.cat([b.tokens for b in batches]).to(self.device)
        labels = torch.cat([b.labels for b in batches]).to(self.device)
        inputs = (tokens,) if self.first else ()
        losses: list[torch.Tensor] = []
        # return_outputs=False: the last stage keeps no micro-batch's logits past its loss (with True it holds
        # all of them, merged, until the next step)
        run(*inputs, target=labels if self.last else None, losses=losses if self.last else None, return_outputs=False)
        if not self.last:
            return 0.0, 0
        return sum(float(loss) for loss in losses) * labels.numel(), labels.numel()

    def step(self, batches: Sequence[Batch]) -> tuple[float, int]:
        """One step's forwards and backwards: its micro-batches are the schedule's."""
        return self._run(batches, self.schedule.step)

    def evaluate(self, batches: Sequence[Batch]) -> tuple[float, int]:
        """Forwards only (the schedule's eval), as many schedule steps as the micro-batches fill."""
        count = self.loss.micro_batches
        if len(batches) % count:
            raise ValueError(f"{len(batches)} evaluation micro-batches do not fill steps of {count}")
        total, tokens = 0.0, 0
        with torch.no_grad():
            for first in range(0, len(batches), count):
                loss, n = self._run(batches[first : first + count], self.schedule.eval)
                total, tokens = total + loss, tokens + n
        return total, tokens


def build_pipeline(
    stages: Sequence[tuple[int, torch.nn.Module]],
    num_stages: int,
    schedule_name: str,
    micro_batches: int,
    pp_mesh: DeviceMesh,
    device: torch.device,
) -> Pipeline:
    """torchtitan's build_pipeline_schedule: the named schedule over these (already parallelized) stages."""
    kind = get_schedule_class(schedule_name)
    group = pp_mesh.get_group()
    wrapped = [PipelineStage(module, index, num_stages, device, group=group) for index, module in stages]
    loss = MicroBatchLoss(micro_batches)
    looped = issubclass(kind, PipelineScheduleMulti)
    if not looped and len(wrapped) != 1:
        raise ValueError(f"pipeline_parallel_schedule={schedule_name!r} runs one stage per rank, not {len(wrapped)}")
    schedule = kind(wrapped if looped else wrapped[0], n_microbatches=micro_batches, loss_fn=loss, scale_grads=False)
    return Pipeline(
        schedule=schedule,
        loss=loss,
        first=any(s.is_first for s in wrapped),
        last=any(s.is_last for s in wrapped),
        device=device,
    )
