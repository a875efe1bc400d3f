"""TP slowdown: the Plan's communication estimate says tensor-parallel traffic dominates the step
(the seed's "TP8 slower than TP4"), so more TP made the run slower, not faster.

Needs --build: the share is plan.json's `comm.share_of_step` (communication time over step time,
a fraction; the comm estimate of compiler/models, issue 3); the log adds its last timed step
as evidence when it has one.
"""

from __future__ import annotations

from typing import Any

from compiler.doctor.findings import Evidence, Finding, Fix, LogText
from compiler.logs.context import RunContext
from compiler.logs.parse import parse_lines

COMM_SHARE_LIMIT = 0.30  # the seed: comm over 30% of compute time is where TP stops paying


def comm_share(derived: dict[str, Any]) -> tuple[float, dict[str, Any]] | None:
    """The Plan's communication share of step time and its whole comm section, when it has one."""
    comm = derived.get("comm")
    if not isinstance(comm, dict) or not isinstance(comm.get("share_of_step"), (int, float)):
        return None
    return float(comm["share_of_step"]), comm


def _tp_fixes(context: RunContext) -> list[Fix]:
    layout, hw = context.derived["layout"], context.spec.hardware
    tp, pp = int(layout["tp"]), int(layout["pp"])
    if hw.intra_node.link == "pcie":
        fixes = [Fix("parallel.tp", "1", f"from {tp}: {hw.gpu.name} has no NVLink, every TP all-reduce crosses PCIe")]
    else:
        fixes = [Fix("parallel.tp", str(tp // 2), f"from {tp}: half the all-reduce traffic per layer")]
    if pp * 2 <= context.spec.model.num_layers:
        fixes.append(Fix("parallel.pp", str(pp * 2), f"from {pp}: keeps per-GPU memory as TP drops; PP sends "
                         "only activations between stages"))
    return fixes


class TpSlowdown:
    name = "tp_slowdown"

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        if context is None or int(context.derived["layout"]["tp"]) <= 1:
            return None
        found = comm_share(context.derived)
        if found is None or found[0] <= COMM_SHARE_LIMIT:
            return None
        share, comm = found
        tp = context.derived["layout"]["tp"]
        cause = (f"The Plan estimates communication at {share:.0%} of step time (> {COMM_SHARE_LIMIT:.0%}) with "
                 f"tp={tp} on {context.spec.hardware.intra_node.link}: TP all-reduces twice per layer in forward "
                 "and backward, so higher TP adds traffic faster than it removes compute.")
        evidence = [Evidence(0, f"plan.json comm: {', '.join(f'{k}={v}' for k, v in sorted(comm.items()))}")]
        steps = parse_lines(log.lines, "log").steps
        timed = [s for s in steps if s.step_time_s]
        if timed:
            evidence.append(Evidence(timed[-1].line, log.lines[timed[-1].line - 1].strip()[:240]))
        return Finding(self.name, "tensor parallelism dominated by communication", cause, tuple(evidence),
                       tuple(_tp_fixes(context)))
