"""``kernaudit export``: vLLM-style tuned-config JSON, from APPROVED recommendations only.

One file per (kernel, weight shape N x K, device), named as vLLM names its
tuned configs (``N=4096,K=4096,device_name=NVIDIA_H200.json``) and mapping
batch size M to a config; vLLM picks the nearest M at run time. Files go to
``<data>/exports/<kernel>/`` unless ``--out`` says otherwise, with a
``manifest.json`` naming the approvals behind every entry.

Anything not APPROVED is refused with the reason, and so is an approved
recommendation that has no complete config to ship (keep the baseline, fix
correctness), lacks M/N/K, was refuted by verification, or conflicts with
another approved one for the same M. Without ids, every approved one with a
config is exported and the others are listed as skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from kernaudit_pipeline.core.configs import COLUMN_TO_VLLM, VLLM_REQUIRED
from kernaudit_pipeline.recommendations.model import Action, Recommendation, ReviewState, VerificationState
from kernaudit_pipeline.recommendations.review import (
    ReviewError, UnknownRecommendation, data_dir, load_recommendations, read_trail, review_states,
)

NO_CONFIG_ACTIONS = frozenset({Action.KEEP_BASELINE, Action.FIX_CORRECTNESS, Action.REMEASURE})
MANIFEST = "manifest.json"


def vllm_entry(config: dict) -> dict[str, int]:
    """One vLLM config entry; raises ValueError naming any missing key."""
    missing = [k for k in VLLM_REQUIRED if config.get(k) is None]
    if missing:
        raise ValueError(f"config lacks {', '.join(missing)} for a vLLM entry")
    return {COLUMN_TO_VLLM[k]: int(config[k]) for k in VLLM_REQUIRED}


def vllm_filename(n: int, k: int, device_name: str | None) -> str:
    return f"N={n},K={k},device_name={(device_name or 'unknown_device').strip().replace(' ', '_')}.json"


class ExportRefused(ReviewError):
    """Nothing is written when any selected recommendation cannot be exported."""


@dataclass(frozen=True)
class ExportResult:
    files: tuple[Path, ...]
    rec_ids: tuple[str, ...]
    manifest: Path
    skipped: tuple[str, ...] = ()  # approved, but nothing to export (with the reason)


def refusal(rec: Recommendation) -> str | None:
    """Why ``rec`` cannot be exported, or None."""
    if rec.review_state != ReviewState.APPROVED:
        return (f"{rec.rec_id} is {rec.review_state}, not APPROVED; a person must approve it first "
                f"(kernaudit review approve {rec.rec_id} --reviewer NAME --comment TEXT)")
    if rec.action in NO_CONFIG_ACTIONS or not rec.new_config:
        return f"{rec.rec_id} ({rec.code}) proposes no kernel config to export"
    if rec.verification.state == VerificationState.REFUTED:
        return f"{rec.rec_id} was refuted by verification: {rec.verification.note}"
    missing = [d for d in ("M", "N", "K") if d not in rec.shape_dims]
    if missing:
        return f"{rec.rec_id} has no {'/'.join(missing)} (not a GEMM-shaped problem); vLLM keys configs by M, N, K"
    try:
        vllm_entry(rec.new_config)
    except ValueError as exc:
        return f"{rec.rec_id}: {exc}"
    return None


def plan_export(recs: list[Recommendation]) -> dict[tuple[str, str, str], dict[str, tuple[dict, str]]]:
    """{(kernel, device file part, file name): {M: (entry, rec_id)}}; raises ExportRefused."""
    reasons = [r for r in (refusal(rec) for rec in recs) if r]
    if reasons:
        raise ExportRefused("export refused: " + "; ".join(reasons))
    files: dict[tuple[str, str, str], dict[str, tuple[dict, str]]] = {}
    for rec in recs:
        dims = rec.shape_dims
        name = vllm_filename(dims["N"], dims["K"], rec.device_name)
        table = files.setdefault((rec.kernel_name, str(rec.device_name), name), {})
        entry, m = vllm_entry(rec.new_config), str(dims["M"])
        if m in table and table[m][0] != entry:
            raise ExportRefused(f"export refused: {table[m][1]} and {rec.rec_id} both set M={m} in "
                                f"{rec.kernel_name}/{name} with different configs; reject one of them")
        table[m] = (entry, rec.rec_id)
    return files


def export_vllm_configs(recs: list[Recommendation], out_dir: str | Path,
                        approvals: dict | None = None) -> ExportResult:
    """Write the files for ``recs`` (all must be exportable) and a manifest of their approvals."""
    if not recs:
        raise ExportRefused("export refused: no recommendations selected")
    plan = plan_export(recs)
    out = Path(out_dir)
    written: list[Path] = []
    for (kernel, _device, name), table in sorted(plan.items()):
        folder = out / kernel
        folder.mkdir(parents=True, exist_ok=True)
        body = {m: table[m][0] for m in sorted(table, key=int)}
        path = folder / name
        path.write_text(json.dumps(body, indent=4) + "\n")
        written.append(path)
    approvals = approvals or {}
    manifest = {
        "generated_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "files": {str(p.relative_to(out)): sorted({rid for _, rid in plan[k].values()})
                  for k, p in zip(sorted(plan), written)},
        "approvals": [
            {"rec_id": r.rec_id, "kernel_name": r.kernel_name, "shape_name": r.shape_name,
             "device_name": r.device_name, "code": r.code, "verification": str(r.verification.state),
             **({"reviewer": approvals[r.rec_id].reviewer, "timestamp_utc": approvals[r.rec_id].timestamp_utc,
                 "comment": approvals[r.rec_id].comment} if r.rec_id in approvals else {})}
            for r in recs
        ],
    }
    mpath = out / MANIFEST
    mpath.write_text(json.dumps(manifest, indent=2) + "\n")
    return ExportResult(tuple(written), tuple(r.rec_id for r in recs), mpath)


def export_approved(data: str | Path, out_dir: str | Path | None = None,
                    rec_ids: list[str] | None = None) -> ExportResult:
    """Export from the data folder's store: the given ids (each must be APPROVED) or every approved one."""
    root = Path(data)
    recs = load_recommendations(root)
    by_id = {r.rec_id: r for r in recs}
    if rec_ids:
        unknown = [i for i in rec_ids if i not in by_id]
        if unknown:
            raise UnknownRecommendation(f"unknown recommendation id(s): {', '.join(unknown)}")
        chosen = [by_id[i] for i in rec_ids]
        skipped: list[str] = []
    else:
        approved = [r for r in recs if r.review_state == ReviewState.APPROVED]
        if not approved:
            pending = sum(r.review_state == ReviewState.PENDING_REVIEW for r in recs)
            raise ExportRefused(f"export refused: no APPROVED recommendations ({pending} pending review); "
                                "approve with kernaudit review approve REC_ID --reviewer NAME --comment TEXT")
        # approved decisions without a config (keep the baseline, remeasure) have nothing to export
        chosen = [r for r in approved if refusal(r) is None]
        skipped = [refusal(r) for r in approved if refusal(r) is not None]
        if not chosen:
            raise ExportRefused("export refused: " + "; ".join(skipped))
    approvals = review_states(read_trail(root))
    result = export_vllm_configs(chosen, Path(out_dir) if out_dir else root / "exports", approvals)
    return replace(result, skipped=tuple(skipped))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        print(f"kernaudit export: {message}", file=sys.stderr)
        raise SystemExit(2)


def cli(argv: list[str]) -> int:
    parser = _Parser(prog="kernaudit export",
                     description="Write vLLM-style tuned-config JSON from APPROVED recommendations only.")
    parser.add_argument("rec_ids", nargs="*", metavar="REC_ID",
                        help="recommendations to export (default: every APPROVED one)")
    parser.add_argument("--out", default=None, help="output folder (default: <data>/exports)")
    parser.add_argument("--data-dir", default=None, help="data folder (default: $KERNAUDIT_DATA_DIR or ./data)")
    args = parser.parse_args(argv)
    try:
        result = export_approved(data_dir(args.data_dir), args.out, args.rec_ids or None)
    except UnknownRecommendation as exc:
        print(f"kernaudit export: {exc}", file=sys.stderr)
        return 2
    except ReviewError as exc:
        print(f"kernaudit export: {exc}", file=sys.stderr)
        return 1
    for reason in result.skipped:
        print(f"kernaudit export: skipped: {reason}", file=sys.stderr)
    for path in result.files:
        print(path)
    print(f"exported {len(result.rec_ids)} approved recommendation(s); manifest {result.manifest}")
    return 0
