"""Bytes autograd saves for backward, counted by storage and charged to the module that saved them.

What the memory model calls activations: every tensor saved for backward during one forward
(torch.autograd.graph.saved_tensors_hooks), each storage counted once (views share it),
parameters and the caller's own inputs excluded (they live for the whole run). Each storage is
charged to the innermost labelled module whose forward was running when it was first saved;
outside every labelled module it is charged to `outside`. DeepSpeed's activation checkpointing keeps
its layer inputs as an attribute of its autograd node, out of the hooks' sight: `add_held` counts
such tensors from the graph.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any


class SavedBytes:
    """Bytes per label, each storage counted once, excluded storages never."""

    def __init__(self, excluded: Iterable[Any], outside: str) -> None:
        self.totals: dict[str, int] = defaultdict(int)
        self.stack = [outside]
        self._seen = {t.untyped_storage().data_ptr() for t in excluded}

    def charge(self, tensor: Any, label: str | None = None) -> None:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self._seen:
            self._seen.add(storage.data_ptr())
            self.totals[label or self.stack[-1]] += storage.nbytes()

    def add_held(self, root: Any, attribute: str, label: str) -> None:
        """Charge to `label` the tensors that the autograd nodes reachable from `root` (a grad_fn) keep
        in `attribute` (a custom Function's ctx is its node)."""
        import torch

        stack, visited = [root], set()
        while stack:
            node = stack.pop()
            if node is None or id(node) in visited:
                continue
            visited.add(id(node))
            for tensor in getattr(node, attribute, None) or ():
                if torch.is_tensor(tensor):
                    self.charge(tensor, label)
            stack.extend(next_node for next_node, _ in node.next_functions)


@contextmanager
def saved_bytes(
    labels: Iterable[tuple[str, Any]], excluded: Iterable[Any], outside: str = "outside"
) -> Iterator[SavedBytes]:
    """Inside the block, count what autograd saves; the yielded record's totals (label -> bytes) fill as
    it runs. `labels`: (label, module) pairs; `excluded`: tensors whose storages are not counted."""
    import torch

    record = SavedBytes(excluded, outside)
    stack = record.stack

    def pack(tensor: Any) -> Any:
        record.charge(tensor)
        return tensor

    def enter(label: str) -> Any:
        return lambda _module, _args: stack.append(label) and None

    def leave(_module: Any, _args: Any, _output: Any) -> None:
        stack.pop()

    handles = []
    for label, module in labels:
        handles += [module.register_forward_pre_hook(enter(label)), module.register_forward_hook(leave)]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            yield record
    finally:
        for handle in handles:
            handle.remove()
