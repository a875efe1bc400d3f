"""What every command's `--help` opens and ends with: a description, then examples to copy."""

from __future__ import annotations

import argparse
import textwrap
from typing import Any

_WIDTH = 88


def described(description: str, *examples: str) -> dict[str, Any]:
    """`add_parser` keywords: the description (paragraphs split by blank lines, each wrapped) and the
    examples, each printed as written."""
    paragraphs = [textwrap.fill(" ".join(p.split()), _WIDTH) for p in description.strip().split("\n\n")]
    return {
        "description": "\n\n".join(paragraphs),
        "epilog": "examples:\n" + "\n".join(f"  {example}" for example in examples),
        "formatter_class": argparse.RawDescriptionHelpFormatter,
    }
