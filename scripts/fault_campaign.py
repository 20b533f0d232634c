#!/usr/bin/env python3
"""Run the malformed-input campaign over every entry point and print what fell short.

    .venv/bin/python scripts/fault_campaign.py [--only SUBSTRING] [--json FILE]

The cases live in tests/faults/campaign.py (they are also the test suite's fault tests).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.faults.campaign import cases  # noqa: E402
from tests.faults.runner import run_campaign  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only the cases whose name contains this text")
    parser.add_argument("--json", type=Path, help="also write every outcome to this JSON file")
    parser.add_argument("--timeout-s", type=float, default=240.0, help="a case silent this long is a hang")
    args = parser.parse_args()
    selected = [c for c in cases() if args.only in c.name]
    outcomes = []
    for o in run_campaign(selected, per_case_timeout_s=args.timeout_s):
        outcomes.append(o)
        mark = "ok " if not o.problems else "BAD"
        print(f"{mark} {o.seconds:6.1f}s rc={o.exit_code!s:>4}  {o.name}"
              + (f"  <- {'; '.join(o.problems)} | {o.detail}" if o.problems else ""), flush=True)
    by_cmd = Counter(o.command for o in outcomes)
    bad = [o for o in outcomes if o.problems]
    kinds = Counter(p.split(" (")[0] for o in bad for p in o.problems)
    print(f"\n{len(outcomes)} cases over {len(by_cmd)} entry points ({dict(by_cmd)}); "
          f"{len(bad)} fell short: {dict(kinds) or 'none'}")
    if args.json:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
