"""Typed specs straight from a composition, for tests that probe layouts the semantic rules refuse."""

from __future__ import annotations

from lmspec.compiler.spec.load import compose_spec
from lmspec.compiler.spec.sections import Spec
from lmspec.compiler.spec.typed import from_dict


def spec_of(*overrides: str) -> Spec:
    """The typed spec of the built-in spec plus `overrides`, without the semantic rules."""
    return from_dict(Spec, compose_spec(list(overrides)).spec)
