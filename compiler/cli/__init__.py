"""The `lmspec` command line: one module per verb."""
