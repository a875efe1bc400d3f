"""The steps of a log as compact columns, merged as `parse_lines` always merged them.

Records of one step (DeepSpeed prints two lines per step, a restarted run prints steps again)
merge into one: the first record of a step sets each field, later ones fill only the fields
still empty, and the step keeps the line of its first record. Steps come out in step order.

Memory: a step costs 8 bytes per field it carries plus 18 (step, line, field mask), in
`array` columns, not ~500 bytes of Python objects; steps logged out of order wait in a small
dict (at most PENDING_STEPS) before they are merged into the sorted columns.

Exact up to MAX_EXACT_STEPS distinct steps, which no real training run's log reaches
(Llama 3 405B trained ~1M optimizer steps; Megatron logs every log_interval of them). Past it
the table keeps only the steps whose number is a multiple of `stride` (2, then 4, ...), so a
10 GB log needs no more memory than a 1 GB one: the statistics then describe every stride-th
step (a deterministic sample: the same log gives the same report), while the counts of steps
logged and used, the last loss and the peak memory still cover every step (counting a step
once when it is logged in increasing order, as logs do; a restart's repeated steps are the
same steps). `sampled_note()` says so in the report.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterator

import numpy as np

from lmspec.compiler.observe.metrics_record import INT_FIELDS, METRIC_FIELDS, StepMetrics

MAX_EXACT_STEPS = 1 << 19  # 524,288 steps: ~60 MB of columns for Megatron's 8 fields
PENDING_STEPS = 1 << 14
_INT64 = (-(1 << 63), (1 << 63) - 1)
_BIT = {name: 1 << i for i, name in enumerate(METRIC_FIELDS)}


class StepTable:
    def __init__(self, count_above: int = 0) -> None:
        """count_above: the warm-up boundary; steps above it are counted apart (steps used)."""
        self.count_above = count_above
        self.stride = 1
        self._steps = array("q")
        self._lines = array("q")
        self._masks = array("H")  # bit i: field METRIC_FIELDS[i] is set in this row
        self._columns: dict[str, array] = {}  # created when a field first appears
        self._odd: dict[tuple[int, str], int | float] = {}  # counts an int64 cannot hold
        self._pending: dict[int, StepMetrics] = {}  # steps below the last one, not in the columns yet
        self._max_step: int | None = None
        # steps left out of a sample (stride > 1): counted, and what the report needs of every step
        self.dropped = 0
        self.dropped_above = 0
        self.dropped_peak: int | None = None
        self.dropped_last_loss: tuple[int, float] | None = None  # (step, loss) of the latest step with a loss

    @property
    def max_step(self) -> int | None:
        """The largest step seen, kept or not."""
        return self._max_step

    def __len__(self) -> int:
        """Distinct steps kept."""
        return len(self._steps) + len(self._pending)

    @property
    def distinct(self) -> int:
        """Distinct steps seen, kept or not."""
        return len(self) + self.dropped

    def add(self, record: StepMetrics) -> None:
        step = record.step
        if not _INT64[0] <= step <= _INT64[1]:
            return  # not a step number any log writes; an int64 column cannot hold it
        newest = self._max_step is None or step > self._max_step
        if newest:
            self._max_step = step
        if self.stride > 1 and step % self.stride:
            if newest:
                self.dropped += 1
                self.dropped_above += step > self.count_above
            self._drop(record)
            return
        steps = self._steps
        if newest:
            self._append(record)
            if len(steps) > MAX_EXACT_STEPS:
                self._thin()
        elif steps and step == steps[-1]:
            self._fill(len(steps) - 1, record)
        else:
            row = bisect_left(steps, step)
            if row < len(steps) and steps[row] == step:
                self._fill(row, record)
            elif step in self._pending:
                self._pending[step] = self._pending[step].filled_from(record)
            else:
                self._pending[step] = record
                if len(self._pending) > PENDING_STEPS:
                    self._flush()

    def _append(self, record: StepMetrics) -> None:
        row = len(self._steps)
        self._steps.append(record.step)
        self._lines.append(record.line)
        mask = 0
        columns = self._columns
        for name in METRIC_FIELDS:
            value = getattr(record, name)
            column = columns.get(name)
            if value is None:
                if column is not None:
                    column.append(0)
                continue
            mask |= _BIT[name]
            if column is None:
                column = columns[name] = array("q" if name in INT_FIELDS else "d", bytes(8 * row))
            if column.typecode == "d" or (type(value) is int and _INT64[0] <= value <= _INT64[1]):
                column.append(value)
            else:
                self._put(column, row, name, value, append=True)
        self._masks.append(mask)

    def _put(self, column: array, row: int, name: str, value: int | float, append: bool) -> None:
        if column.typecode == "q" and not (isinstance(value, int) and _INT64[0] <= value <= _INT64[1]):
            self._odd[(row, name)] = value  # a count past int64
            value = 0
        if append:
            column.append(value)
        else:
            column[row] = value

    def _fill(self, row: int, record: StepMetrics) -> None:
        """Fields the row does not have yet, from a later record of its step."""
        mask = self._masks[row]
        for name in METRIC_FIELDS:
            value = getattr(record, name)
            if value is None or mask & _BIT[name]:
                continue
            column = self._columns.get(name)
            if column is None:
                column = self._columns[name] = array("q" if name in INT_FIELDS else "d", bytes(8 * len(self._steps)))
            self._put(column, row, name, value, append=False)
            mask |= _BIT[name]
        self._masks[row] = mask

    def _flush(self) -> None:
        """Merge the pending steps into the sorted columns (disjoint from them: a plain merge)."""
        if not self._pending:
            return
        pending = [self._pending[s] for s in sorted(self._pending)]
        self._pending = {}
        other = StepTable()
        for record in pending:
            other._append(record)
        at = np.searchsorted(np.frombuffer(self._steps, dtype=np.int64), [r.step for r in pending])
        self._merge_rows(other, at)

    def _merge_rows(self, other: StepTable, at: np.ndarray) -> None:
        """Insert all rows of `other` before the rows `at` (sorted) of this table."""
        n = len(self._steps)
        order = np.arange(n + len(at))
        new_at = at + np.arange(len(at))  # where each inserted row lands
        old_mask = np.ones(len(order), dtype=bool)
        old_mask[new_at] = False
        old_at = order[old_mask]

        def merged(mine: array, theirs: array, typecode: str, dtype: str) -> array:
            out = np.empty(n + len(at), dtype=dtype)
            out[old_at] = np.frombuffer(mine, dtype=dtype) if len(mine) else np.zeros(n, dtype=dtype)
            out[new_at] = np.frombuffer(theirs, dtype=dtype) if len(theirs) else np.zeros(len(at), dtype=dtype)
            return array(typecode, out.tobytes())

        self._steps = merged(self._steps, other._steps, "q", "<i8")
        self._lines = merged(self._lines, other._lines, "q", "<i8")
        self._masks = merged(self._masks, other._masks, "H", "<u2")
        for name in set(self._columns) | set(other._columns):
            code = "q" if name in INT_FIELDS else "d"
            dtype = "<i8" if code == "q" else "<f8"
            mine = self._columns.get(name, array(code, bytes(8 * n)))
            theirs = other._columns.get(name, array(code, bytes(8 * len(at))))
            self._columns[name] = merged(mine, theirs, code, dtype)
        odd = {(int(old_at[row]), name): v for (row, name), v in self._odd.items()}
        odd.update({(int(new_at[row]), name): v for (row, name), v in other._odd.items()})
        self._odd = odd

    def _thin(self) -> None:
        """Keep every other step number (by value), until the table is at most half full."""
        self._flush()
        while len(self._steps) > MAX_EXACT_STEPS // 2:
            self.stride *= 2
            steps = np.frombuffer(self._steps, dtype=np.int64)
            keep = steps % self.stride == 0
            dropped_rows = np.flatnonzero(~keep)
            for row in dropped_rows.tolist():
                record = self._record(row)
                self.dropped += 1
                self.dropped_above += record.step > self.count_above
                self._drop(record)
            kept_rows = np.flatnonzero(keep)
            new_row = np.full(len(steps), -1, dtype=np.int64)
            new_row[kept_rows] = np.arange(len(kept_rows))
            del steps

            def kept(column: array, dtype: str, keep: np.ndarray = keep) -> array:
                return array(column.typecode, np.frombuffer(column, dtype=dtype)[keep].tobytes())

            self._steps = kept(self._steps, "<i8")
            self._lines = kept(self._lines, "<i8")
            self._masks = kept(self._masks, "<u2")
            for name, column in self._columns.items():
                self._columns[name] = kept(column, "<i8" if column.typecode == "q" else "<f8")
            self._odd = {(int(new_row[row]), name): v for (row, name), v in self._odd.items() if new_row[row] >= 0}

    def _drop(self, record: StepMetrics) -> None:
        """What the report keeps of a step the sample leaves out: peak memory and the last loss."""
        peak = record.peak_memory_bytes
        if peak is not None and (self.dropped_peak is None or peak > self.dropped_peak):
            self.dropped_peak = peak
        if record.loss is not None and (self.dropped_last_loss is None or record.step > self.dropped_last_loss[0]):
            self.dropped_last_loss = (record.step, record.loss)

    def _record(self, row: int) -> StepMetrics:
        mask = self._masks[row]
        odd = self._odd
        values = {name: column[row] for name, column in self._columns.items() if mask & _BIT[name]}
        if odd:
            for name in values:
                if (row, name) in odd:
                    values[name] = odd[(row, name)]
        return StepMetrics.of(self._steps[row], self._lines[row], values)

    def records(self) -> Iterator[StepMetrics]:
        """Every kept step, in step order, as a fresh StepMetrics."""
        self._flush()
        for row in range(len(self._steps)):
            yield self._record(row)

    def sampled_note(self) -> str | None:
        if self.stride == 1:
            return None
        return (
            f"the log holds {self.distinct:,} steps, more than the {MAX_EXACT_STEPS:,} read exactly: "
            f"the statistics use every {self.stride}th step (step numbers divisible by {self.stride}); "
            "counts, last loss and peak memory cover every step"
        )
