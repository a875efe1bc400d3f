"""Reading what a run wrote: training logs (`lmspec logs`) and failure signatures (`lmspec doctor`)."""
