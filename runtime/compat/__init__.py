"""Every patch of an upstream library, one module per upstream, scoped and version-checked."""
