"""The spec: typed sections, their schema, compose with provenance (the one Hydra seam), validation."""
