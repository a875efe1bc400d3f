"""`lmspec plan`: an analytic search over every legal parallel layout of a job.

The search enumerates the layout space stage by stage (world, tp, pp, cp; then ep;
then micro batch; then optimizer sharding, sequence parallel and recompute), drops
what a rule rejects with the rule's own predicate evaluated on numpy arrays, prices
what is left with the memory and FLOPs models of `lmspec.compiler.models` and the step-time
model of `steptime`, and ranks it. numpy is imported here only: `lmspec check` and
`compile` never load it.
"""
