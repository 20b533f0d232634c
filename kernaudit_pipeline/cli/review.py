"""``kernaudit review``: still parsed by ``kernaudit_pipeline.recommendations.review.cli`` (to be moved into this module)."""

from __future__ import annotations

import importlib

LEGACY = True


def run_legacy(argv: list[str]) -> int:
    return int(importlib.import_module("kernaudit_pipeline.recommendations.review").cli(argv) or 0)
