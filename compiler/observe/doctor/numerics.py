"""NaN/Inf loss and fp16 loss-scale collapse, mapped to the seed's checklist: bf16, gradient
clipping at 1.0, a fifth of the learning rate, and a look at the data around the step.

Formats: Megatron-LM pretrain_gpt.py / megatron/core/rerun_state_machine.py (``found NaN in local
forward loss calculation``, ``Unexpected result nan ...``), training.py (``number of nan iterations:
  3 |``, a loss printed as ``NAN``), deepspeed/runtime/fp16/loss_scaler.py (``[deepspeed] OVERFLOW!
Rank 0 Skipping step. Attempted loss scale: 2, reducing to 1``; ZeRO-2 of 2020 writes
``[deepscale]`` and float scales ``2147483648.0``; ``Current loss scale already at minimum``), Apex
(apex/amp/scaler.py: ``Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to
8.165126103939127e-202``, https://github.com/NVIDIA/apex/issues/318; one space after the full stop in
some copies; apex/fp16_utils: ``OVERFLOW! Skipping step. Attempted loss scale: 4, reducing to 2``): a
scale reduced to LOSS_SCALE_COLLAPSED_AT or below is a collapse, whichever scaler printed it. A grad
norm printed as ``grad norm: nan`` (Megatron-LM, Megatron-DeepSpeed) or ``Bad grad_norm detected
(grad_norm=nan)``, lmspec's runtime/train/metrics.py (``loss is nan at step 17: stopping.``), a
metrics.jsonl ``"loss": NaN``, and the loss fields a plain loop prints, under any name ending or
starting in ``loss`` (``loss: nan``, ``step: 100 total_loss: nan obj_cls: nan``,
https://github.com/thodan/epos/issues/10; ``Epoch: 12 mask_loss:  nan``; mmdetection's ``loss_cls:
nan``); ``nan`` only as a whole word after the field's separator.

Megatron's training_log prints a loss only when its average is > 0, so a NaN loss drops the
``lm loss:`` field from the iteration line: an iteration line without a loss after one with it,
and no step skipped on it, is a NaN loss too.
"""

from __future__ import annotations

import re

from lmspec.compiler.observe.doctor.findings import Evidence, Finding, Fix, Hit, LogText, Watch
from lmspec.compiler.observe.logs.context import RunContext
from lmspec.compiler.spec.sections import TrainSpec

_NAN = re.compile(
    r"found (?:NaN|Inf) in local (?:forward loss calculation|grad norm)|Unexpected result -?(?:nan|inf)\b"
    r"|number of nan iterations:\s*[1-9]"
    # a loss field of any loop, its name's words joined by ``_`` (``mask_loss:  nan``, ``loss_cls: nan``), or a
    # grad norm; the word before ``loss`` may not run into it (not ``floss``)
    r"|(?<![A-Za-z0-9])(?:loss(?:_[A-Za-z0-9]+)*|grad[ _]norm)\b\"?\s*(?:[:=]|is)\s*-?(?:nan|inf(?:inity)?)\b"
    r"|\bloss\s+-?(?:nan|inf)\s*\|",  # old Megatron fields without a colon: ``| lm loss NAN |``
    re.IGNORECASE | re.ASCII,  # log messages are ASCII: ASCII case folding, ASCII \b and \s
)
# DeepSpeed prints ints, ZeRO-2 once printed floats (2147483648.0), Apex Python floats (8.165126103939127e-202)
_SCALE = r"\d{1,30}(?:\.\d*)?(?:[eE][-+]?\d{1,3})?"
# A skipped step and the scale it leaves (group "to" or "to_apex"), in each loss scaler's words: DeepSpeed's
# ``OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 2, reducing to 1`` (Apex FP16_Optimizer's without the
# rank; DeepSpeed's unfused optimizer's ``fp16 dynamic loss scale overflow! Skipping step. ...``) and Apex amp's
# ``Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 0.03125`` (one space or two after the
# full stop; older releases without ``loss scaler N``; FP16_Optimizer's ``OVERFLOW within closure! ...``)
_OVERFLOW = re.compile(
    rf"(?:OVERFLOW|overflow)! (?:Rank \d+ )?Skipping step\. Attempted loss scale: {_SCALE}, "
    rf"reducing to (?P<to>{_SCALE})"
    rf"|(?:Gradient overflow\.|OVERFLOW within closure!)\s+Skipping step, (?:loss scaler \d+ )?reducing loss scale to "
    rf"(?P<to_apex>{_SCALE})"
)
_ITERATION = r"\biteration\s+\d+/\s*\d+\s*\|"  # Megatron's `` iteration      120/   10000 |``
_LOSS_FIELD = r"(?<![A-Za-z])loss: "  # Megatron's ``lm loss: ``, GPT-NeoX's ``lm_loss: ``; not ``loss scale:``
_ITER_WITH_LOSS = re.compile(_ITERATION + r".*?" + _LOSS_FIELD + r"[-+]?\d")
_ITER_LOSS_GONE = re.compile(_ITERATION + rf"(?!.*{_LOSS_FIELD})(?!.*\bnumber of skipped iterations:\s*[1-9])")
_AT_MINIMUM = re.compile(r"Current loss scale already at minimum")
_LR = re.compile(r"\b(?:learning rate|lr)\b\"?\s*[:=]?\s*\[?([-+]?\d+\.?\d*(?:[eE][-+]?\d+)?)")
# A warm-up halves from 2^16 (or 2^32) to the hundreds and recovers; a scale down to single digits
# has no headroom left for small fp16 gradients, and min_loss_scale (1) is two halvings away.
LOSS_SCALE_COLLAPSED_AT = 4
LR_DIVISOR = 5  # the seed's checklist: restart from the last good checkpoint with lr / 5


def _collapsed(match: re.Match[str]) -> bool:
    """An overflow that took the loss scale down to LOSS_SCALE_COLLAPSED_AT or below."""
    return float(_scale_to(match)) <= LOSS_SCALE_COLLAPSED_AT


def _scale_to(match: re.Match[str]) -> str:
    """The loss scale an overflow line reduced to, as printed."""
    return match.group("to") or match.group("to_apex")


_LR_WATCH = Watch(_LR, (b"learning rate", b"lr"), keep=0, starts=(b"learning rate", b"lr"), track=True)
_LOSS_SHOWN = Watch(_ITER_WITH_LOSS, (b"iteration ",), keep=0, starts=(b"iteration",), track=True)


def _loss_gone(log: LogText) -> list[Hit]:
    """Megatron iteration lines that lost their loss field after one that had it (a NaN average)."""
    return [hit for hit in log.find(_ITER_LOSS_GONE) if log.last_match_before(_LOSS_SHOWN, hit[0].line)][:1]


def _last_lr(log: LogText, up_to_line: int) -> float | None:
    """The learning rate the log last states at or before a line (1-based)."""
    match = log.last_match_before(_LR_WATCH, up_to_line)
    return float(match.group(1)) if match else None


def _fixes(context: RunContext | None, lr: float | None, first_line: int) -> list[Fix]:
    train = context.spec.train if context else None
    fixes = []
    if train is None or train.precision != "bf16":
        fixes.append(
            Fix(
                "train.precision",
                "bf16",
                "bf16 has fp32's exponent range: no loss scaling, no overflow"
                + (f" (now {train.precision})" if train else ""),
            )
        )
    if train is None or train.grad_clip != 1.0:
        fixes.append(
            Fix(
                "train.grad_clip",
                "1.0",
                "clip the global gradient norm" + (f" (now {train.grad_clip:g})" if train else ""),
            )
        )
    lr = train.optimizer.lr if train else lr
    fixes.append(
        Fix(
            "train.optimizer.lr",
            f"{lr / LR_DIVISOR:.3g}" if lr else "<current / 5>",
            f"a fifth of {lr:.3g}; resume from the last checkpoint before the blow-up"
            if lr
            else "a fifth of the current peak lr; resume from the last good checkpoint",
        )
    )
    fixes.append(
        Fix(
            "train.data.sources",
            _sources(train) if train else "<unchanged>",
            f"check the samples fed just before log line {first_line} (empty/garbage documents, "
            "token ids >= vocab_size)",
        )
    )
    return fixes


def _sources(train: TrainSpec) -> str:
    sources = train.data.sources
    return ",".join(s.path for s in sources) if sources else "null (the built-in corpus)"


class NonFiniteLoss:
    name = "nan_loss"
    watches = (
        # every match of _NAN begins with the first word of one of its branches
        Watch(
            _NAN,
            (b" in local ", b"unexpected result ", b"nan iterations:", b"loss", b"grad norm", b"grad_norm"),
            starts=(b"found ", b"unexpected result ", b"number of nan iterations:", b"loss", b"grad"),
        ),
        Watch(_ITER_LOSS_GONE, (b"iteration ",), starts=(b"iteration",)),
        _LOSS_SHOWN,
        Watch(
            _OVERFLOW,
            (b"OVERFLOW! ", b"overflow! Skipping step", b"Gradient overflow.", b"OVERFLOW within closure!"),
            keep=2,
            last_where=_collapsed,
        ),
        Watch(_AT_MINIMUM, (b"Current loss scale already at minimum",)),
        _LR_WATCH,
    )

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        gone = [] if log.find(_NAN, 1) else _loss_gone(log)
        nan_hits = log.find(_NAN) or gone
        overflow = log.find(_OVERFLOW, limit=2)  # the first two, of log.count(_OVERFLOW)
        collapsed = log.last(_OVERFLOW)  # the last one that took the scale to LOSS_SCALE_COLLAPSED_AT or below
        minimum = log.find(_AT_MINIMUM, limit=1)
        if not nan_hits and not collapsed and not minimum:
            return None
        evidence: list[Evidence] = [e for e, _ in nan_hits]
        if collapsed or minimum:
            evidence += [e for e, _ in overflow + ([collapsed] if collapsed else []) + minimum]
            cause = (
                f"fp16 dynamic loss scaling collapsed ({log.count(_OVERFLOW)} overflow steps skipped, scale down to "
                f"{_scale_to(collapsed[1]) if collapsed else 'its minimum'}): gradients overflow at every "
                "scale, so training diverged."
            )
            title = "loss-scale collapse"
        else:
            cause = (
                "The loss (or gradient norm) became NaN/Inf: a learning rate too high for this batch, "
                "fp16 overflow, no gradient clipping, or a bad batch."
            )
            if gone:
                cause += " Megatron prints only a loss > 0, so a NaN loss left the iteration line without it."
            title = "NaN/Inf loss"
        lines = [e.line for e in evidence]
        return Finding(
            self.name, title, cause, tuple(evidence), tuple(_fixes(context, _last_lr(log, max(lines)), min(lines)))
        )
