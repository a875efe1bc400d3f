"""PyTorch-Lightning progress bars (its TQDMProgressBar, and NeMo 1's bar built on it).

Format read from Lightning-AI/pytorch-lightning `src/lightning/pytorch/callbacks/progress/tqdm_progress.py`
(the training bar's description is ``Epoch {current_epoch}``; its postfix is `get_metrics`: ``v_num``
and every metric logged with ``prog_bar=True``) over tqdm's default bar format
``{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]``,
the rate ``N.NNit/s``, or ``N.NNs/it`` below one batch a second. Examples:
``Epoch 0:  22%|██▏       | 4/18 [00:17<01:02,  4.47s/it, loss=9.926, v_num=193315]``
(https://github.com/Lightning-AI/pytorch-lightning/issues/4225),
``Epoch 1:  69%|██████▊   | 49804/72642 [3:55:49<1:48:08,  3.52it/s, loss=0.532, v_num=1, train_loss=0.255,
train_mrr=0.927, val_loss=0.518, val_mrr=0.891]`` (https://github.com/Lightning-AI/pytorch-lightning/issues/3755),
NeMo 1: ``Epoch 0:   1%|          | 795/77225 [9:07:58<878:01:48, 41.36s/it, loss=3.1, v_num=,
reduced_train_loss=3.090, global_step=794.0, consumed_samples=1.63e+6]``
(https://github.com/NVIDIA/NeMo-Framework-Launcher/issues/55).

A terminal bar is redrawn in place with ``\\r``: the log reader makes each redraw a line of its own
(compiler/observe/logs/reader.py), and a bar redraws the same count more than once: Lightning moves
the bar (the postfix still the previous batch's) and then sets the new postfix. So the last redraw
of a count is that step's record (`LightningBars` holds a count until the next one comes); fields a
later redraw lacks (a paste cut mid-line) are kept from the earlier ones.

The step is ``global_step + 1`` where the postfix states it in full (NeMo 1, as NeMo 2's iteration
lines: compiler/observe/logs/nemo.py; tqdm prints a postfix number in 3 significant digits, so
``global_step=3.2e+4`` is not read), else the bar's count, plus ``epoch * total`` past epoch 0 (the count
restarts each epoch; in Lightning before 1.6 the total also counts the epoch's validation batches).
The loss is ``train_loss_step``, else ``train_loss``, else NeMo's ``reduced_train_loss``, else
``loss`` (Lightning 1.x's running mean of the last 20 batches); the rate (tqdm's smoothed
batches per second) is read as the step time, so with gradient accumulation a "step" is a batch.
"""

from __future__ import annotations

import re

from lmspec.compiler.observe.metrics_record import StepMetrics, digits_int, finite_int

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_BAR = re.compile(r"\bEpoch\s+(\d+):\s*\d+%\|[^|]*\|\s*(\d+)/(\d+)\s*(?:\[(.*))?$")
_RATE = re.compile(r"(?:^|,)\s*(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)(it/s|s/it)")
_POSTFIX = re.compile(r"(?:^|,)\s*([A-Za-z_][\w/.-]*)=([^,\]]*)")
_LOSS_NAMES = ("train_loss_step", "train_loss", "reduced_train_loss", "loss")


def parse_lightning_line(text: str, lineno: int) -> StepMetrics | None:
    """One redraw of the training bar; None for any other line (a validation bar, a cut-off prefix)."""
    if "%|" not in text:  # every bar with a known total carries it
        return None
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    match = _BAR.search(text)
    if match is None:
        return None
    epoch, count, total = (digits_int(match.group(i)) for i in (1, 2, 3))
    if epoch is None or count is None or total is None or count == 0:
        return None  # count 0: the bar drawn before the epoch's first batch
    values: dict[str, float | int] = {}
    fields: dict[str, float] = {}
    timing = match.group(4) or ""
    if (rate := _RATE.search(timing)) is not None:
        speed = float(rate.group(1))
        if rate.group(2) == "s/it":
            values["step_time_s"] = speed
        elif speed > 0:
            values["step_time_s"] = 1 / speed
    exact_step = False  # global_step printed whole: tqdm shows a number in 3 significant digits (3.2e+4)
    for name, shown in _POSTFIX.findall(timing):
        try:
            fields[name] = float(shown)
        except ValueError:
            continue
        if name == "global_step":
            exact_step = "e" not in shown.lower()
    for name in _LOSS_NAMES:
        if name in fields:
            values["loss"] = fields[name]
            break
    if "lr" in fields:
        values["lr"] = fields["lr"]
    global_step = finite_int(fields["global_step"]) if exact_step else None
    if global_step is not None and global_step >= 0:
        step = global_step + 1
    else:
        step = epoch * total + count
    return StepMetrics.of(step, lineno, values)


class LightningBars:
    """Redraws of a bar, one record per count: the last redraw's fields, completed from the earlier ones."""

    def __init__(self) -> None:
        self._held: StepMetrics | None = None

    def feed(self, text: str, lineno: int) -> StepMetrics | None:
        """The record of the count before this line's, once this line moves the bar on; else None."""
        record = parse_lightning_line(text, lineno)
        if record is None:
            return None
        held, self._held = self._held, record
        if held is None:
            return None
        if held.step == record.step:
            self._held = record.filled_from(held)
            return None
        return held

    def flush(self) -> StepMetrics | None:
        """The last count's record, at the end of the log."""
        held, self._held = self._held, None
        return held
