"""``kernaudit export``: vLLM drop-in tuned-config files, from approved recommendations only.

vLLM keeps a kernel's tuned Triton configs in one JSON file per weight shape and device, named by
its ``get_config_file_name`` convention (``E=...,N=...,device_name=...[,dtype=...][,block_shape=[bn,bk]].json``
for fused MoE; ``N=...,K=...,device_name=...,dtype=fp8_w8a8,block_shape=[bn,bk].json`` for the
block-quantized fp8 GEMM), each file mapping a batch size M to a config. At run time it loads the
file as ``{int(M): config}`` and uses the config of the M nearest to the batch it runs. So here:

- one file per (N, K, device_name, dtype, block_shape), named
  ``N={N},K={K},device_name={device}[,dtype={dtype}][,block_shape=[{bn},{bk}]].json`` with the
  device name as vLLM spells it (whitespace and ``/`` runs become ``_``), ``dtype=fp8_w8a8`` for
  fp8 kernels (none for bf16/fp16, as vLLM leaves it out for unquantized weights) and a
  block shape only for block-quantized kernels (none of ``kernels/`` is);
- the file holds every approved M bucket of that (N, K, device, dtype), keys in ascending M, each
  entry exactly vLLM's six keys (BLOCK_SIZE_M/N/K, GROUP_SIZE_M, num_warps, num_stages), nothing
  else (vLLM's loader turns every key into an int);
- files go to ``<data>/exports/<kernel>/`` unless ``--out`` says otherwise, with a
  ``manifest.json`` naming the approval (reviewer, time, content sha256) behind every entry.

What is refused, with the reason: anything not APPROVED, or changed since its approval (STALE);
no config to ship; a config outside physical bounds; REFUTED verification; a config measured
slower than the baseline, unless ``--allow-slower``; an UNVERIFIED one (not measured faster than
the baseline, or not shown to fit), unless ``--allow-unverified``; a shape without M, N, K; two
approvals setting one M of one file to different configs.

Paths stay home: the kernel name (a string from a trace) becomes a safe file-name component
(``safe_component``: ASCII letters, digits, ``._+-`` only, no leading dot, at most 100
characters, a hash suffix whenever anything was replaced), a device name that vLLM's own spelling
would not make a safe file name is refused, and every resolved path must lie under the export
root, or nothing is written.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from kernaudit_pipeline.core.configs import COLUMN_TO_VLLM, VLLM_REQUIRED
from kernaudit_pipeline.core.hardware import Dtype, canonical_dtype
from kernaudit_pipeline.recommendations.model import (
    NO_CONFIG_ACTIONS, Recommendation, ReviewState, VerificationState, content_sha256, refuted_fit,
)
from kernaudit_pipeline.recommendations.review import (
    MANIFEST, ReviewError, UnknownRecommendation, load_recommendations, read_trail, record_exports, review_states,
    write_atomic,
)
from kernaudit_pipeline.recommendations.rules import config_problem

V = VerificationState
SAFE_CHARS = re.compile(r"[^A-Za-z0-9._+-]")
SAFE_NAME = re.compile(r"^[A-Za-z0-9_+-][A-Za-z0-9._+-]*$")
MAX_COMPONENT = 100
MAX_FILE_NAME = 240
# dtype (canonical) -> vLLM's dtype selector; unquantized weights have none
VLLM_DTYPE = {Dtype.FP8: "fp8_w8a8", Dtype.INT8: "int8_w8a8"}
NO_SELECTOR = frozenset({Dtype.BF16, Dtype.FP16, Dtype.FP32, Dtype.TF32})


class ExportRefused(ReviewError):
    """Nothing is written when any selected recommendation cannot be exported."""


@dataclass(frozen=True)
class ExportResult:
    files: tuple[Path, ...]
    rec_ids: tuple[str, ...]
    manifest: Path
    skipped: tuple[str, ...] = ()  # approved, but not exported (with the reason)


def safe_component(text: object, limit: int = MAX_COMPONENT) -> str:
    """One safe path component from any string: never ``..``, ``/``, NUL, a newline or too long."""
    raw = str(text)
    cleaned = SAFE_CHARS.sub("_", raw).lstrip(".")
    if cleaned == raw and cleaned and len(cleaned) <= limit:
        return cleaned
    digest = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{(cleaned or 'unnamed')[:limit - 13]}-{digest}"


def vllm_device_name(device_name: str | None) -> str:
    """The device as vLLM's config file names spell it: whitespace and ``/`` runs become ``_``."""
    return re.sub(r"[\s/]+", "_", (device_name or "").strip())


def vllm_dtype(dtype: str | None) -> str | None:
    """vLLM's dtype selector; raises ValueError for a dtype it has no file convention for."""
    canonical = canonical_dtype(dtype) if dtype else None
    if dtype is None or canonical in NO_SELECTOR:
        return None
    if canonical in VLLM_DTYPE:
        return VLLM_DTYPE[canonical]
    raise ValueError(f"dtype {dtype!r} has no vLLM config-file selector")


def vllm_filename(n: int, k: int, device_name: str | None, dtype: str | None = None,
                  block_shape: tuple[int, int] | None = None) -> str:
    """``N={n},K={k},device_name={device}[,dtype={dtype}][,block_shape=[bn,bk]].json``; ValueError
    when the device name would not make a safe file name."""
    device = vllm_device_name(device_name)
    if not device or not SAFE_NAME.match(device):
        raise ValueError(f"device name {device_name!r} cannot be written as a vLLM file name")
    selector = "" if not dtype else f",dtype={dtype}"
    blocks = "" if not block_shape or not all(block_shape) else f",block_shape=[{block_shape[0]},{block_shape[1]}]"
    name = f"N={int(n)},K={int(k)},device_name={device}{selector}{blocks}.json"
    if len(name) > MAX_FILE_NAME:
        raise ValueError(f"device name {device_name!r} makes a file name over {MAX_FILE_NAME} characters")
    return name


def vllm_entry(config: dict) -> dict[str, int]:
    """One vLLM config entry; raises ValueError naming any missing key."""
    missing = [k for k in VLLM_REQUIRED if config.get(k) is None]
    if missing:
        raise ValueError(f"config lacks {', '.join(missing)} for a vLLM entry")
    return {COLUMN_TO_VLLM[k]: int(config[k]) for k in VLLM_REQUIRED}


def refusal(rec: Recommendation, *, allow_slower: bool = False, allow_unverified: bool = False) -> str | None:
    """Why ``rec`` cannot be exported, or None."""
    v = rec.verification
    if rec.review_state == ReviewState.STALE:
        return (f"{rec.rec_id} changed since it was approved (its content sha256 is now "
                f"{content_sha256(rec)[:12]}); review it again")
    if rec.review_state != ReviewState.APPROVED:
        return (f"{rec.rec_id} is {rec.review_state}, not APPROVED; a person must approve it first "
                f"(kernaudit review approve {rec.rec_id} --reviewer NAME --comment TEXT)")
    if rec.action in NO_CONFIG_ACTIONS or not rec.new_config:
        return f"{rec.rec_id} ({rec.code}) proposes no kernel config to export"
    if problem := config_problem(rec.new_config):
        return f"{rec.rec_id}: {problem}"
    if refuted_fit(v):
        return f"{rec.rec_id} was refuted by verification: {v.note}"
    if v.faster_than_baseline == V.REFUTED and not allow_slower:
        measured = "" if v.speedup_new is None else f" ({v.speedup_new:.3f}x)"
        return (f"{rec.rec_id} was measured slower than the baseline{measured}; pass --allow-slower to "
                "export it anyway")
    if v.faster_than_current == V.REFUTED and not allow_slower:
        return (f"{rec.rec_id} was measured slower than the config it replaces; pass --allow-slower to "
                "export it anyway")
    if v.state == V.UNVERIFIED and not allow_unverified:
        return (f"{rec.rec_id} is UNVERIFIED (fits: {v.fits}, faster than the baseline: "
                f"{v.faster_than_baseline}); pass --allow-unverified to export it anyway")
    missing = [d for d in ("M", "N", "K") if d not in rec.shape_dims]
    if missing:
        return f"{rec.rec_id} has no {'/'.join(missing)} (not a GEMM-shaped problem); vLLM keys configs by M, N, K"
    try:
        vllm_entry(rec.new_config)
        vllm_filename(rec.shape_dims["N"], rec.shape_dims["K"], rec.device_name, vllm_dtype(rec.dtype))
    except ValueError as exc:
        return f"{rec.rec_id}: {exc}"
    return None


FileKey = tuple[str, str]  # (kernel folder, file name)


def plan_export(recs: list[Recommendation]) -> dict[FileKey, dict[str, tuple[dict, Recommendation]]]:
    """{(folder, file name): {M: (entry, rec)}}; raises ExportRefused on a conflicting M."""
    files: dict[FileKey, dict[str, tuple[dict, Recommendation]]] = {}
    for rec in recs:
        dims = rec.shape_dims
        name = vllm_filename(dims["N"], dims["K"], rec.device_name, vllm_dtype(rec.dtype))
        table = files.setdefault((safe_component(rec.kernel_name), name), {})
        entry, m = vllm_entry(rec.new_config), str(int(dims["M"]))
        if m in table and table[m][0] != entry:
            raise ExportRefused(f"export refused: {table[m][1].rec_id} and {rec.rec_id} both set M={m} in "
                                f"{rec.kernel_name}/{name} with different configs; reject one of them")
        table[m] = (entry, rec)
    return files


def _under(root: Path, path: Path) -> Path:
    resolved = path.resolve()
    if not resolved.is_relative_to(root):
        raise ExportRefused(f"export refused: {path} resolves outside the export root {root}")
    return resolved


def write_files(plan: dict[FileKey, dict[str, tuple[dict, Recommendation]]], out: Path,
                approvals: dict) -> tuple[list[Path], Path, dict[str, list[tuple[str, str, str]]]]:
    """Write every file of the plan and the manifest; returns (files, manifest, ledger rows)."""
    root = out.resolve()
    targets = {key: _under(root, root / key[0] / key[1]) for key in plan}  # check every path first
    written: list[Path] = []
    ledger: dict[str, list[tuple[str, str, str]]] = {}
    for key, table in sorted(plan.items()):
        path = targets[key]
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {m: table[m][0] for m in sorted(table, key=int)}
        write_atomic(path, json.dumps(body, indent=4) + "\n")
        written.append(path)
        rel = str(path.relative_to(root))
        ledger[rel] = [(rec.rec_id, m, content_sha256(rec)) for m, (_e, rec) in table.items()]
    recs = {rec.rec_id: rec for table in plan.values() for _e, rec in table.values()}
    manifest = {
        "generated_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "convention": "vLLM tuned Triton configs: {M: config} per (N, K, device_name, dtype, block_shape)",
        "files": {rel: sorted({rid for rid, _m, _c in rows}) for rel, rows in ledger.items()},
        "approvals": [
            {"rec_id": r.rec_id, "kernel_name": r.kernel_name, "shape_name": r.shape_name,
             "device_name": r.device_name, "code": r.code, "config_id": r.new_config_id,
             "verification": str(r.verification.state), "fits": str(r.verification.fits),
             "faster_than_baseline": str(r.verification.faster_than_baseline),
             "speedup": r.verification.speedup_new, "data_kind": str(r.data_kind),
             "content_sha256": content_sha256(r),
             **({"reviewer": approvals[r.rec_id].reviewer, "timestamp_utc": approvals[r.rec_id].timestamp_utc,
                 "comment": approvals[r.rec_id].comment} if r.rec_id in approvals else {})}
            for r in sorted(recs.values(), key=lambda r: r.rec_id)
        ],
    }
    mpath = _under(root, root / MANIFEST)
    write_atomic(mpath, json.dumps(manifest, indent=2) + "\n")
    return written, mpath, ledger


def export_approved(data: str | Path, out_dir: str | Path | None = None, rec_ids: list[str] | None = None, *,
                    allow_slower: bool = False, allow_unverified: bool = False) -> ExportResult:
    """Export from the data folder's store: the given ids (each must be exportable) or every
    exportable approved one. Each file written holds every exportable approved M bucket of its
    (N, K, device, dtype)."""
    root = Path(data)
    out = Path(out_dir) if out_dir else root / "exports"
    if out.exists() and not out.is_dir():
        raise ExportRefused(f"export refused: --out {out} exists and is not a folder")
    recs = load_recommendations(root)
    flags = {"allow_slower": allow_slower, "allow_unverified": allow_unverified}
    by_id = {r.rec_id: r for r in recs}
    skipped: list[str] = []
    if rec_ids:
        unknown = [i for i in rec_ids if i not in by_id]
        if unknown:
            raise UnknownRecommendation(f"unknown recommendation id(s): {', '.join(unknown)}")
        reasons = [r for r in (refusal(by_id[i], **flags) for i in rec_ids) if r]
        if reasons:
            raise ExportRefused("export refused: " + "; ".join(reasons))
        chosen = [by_id[i] for i in rec_ids]
    else:
        approved = [r for r in recs if r.review_state in (ReviewState.APPROVED, ReviewState.STALE)]
        if not approved:
            pending = sum(r.review_state == ReviewState.PENDING_REVIEW for r in recs)
            raise ExportRefused(f"export refused: no APPROVED recommendations ({pending} pending review); "
                                "approve with kernaudit review approve REC_ID --reviewer NAME --comment TEXT")
        chosen = [r for r in approved if refusal(r, **flags) is None]
        skipped = [refusal(r, **flags) for r in approved if refusal(r, **flags) is not None]
        if not chosen:
            raise ExportRefused("export refused: " + "; ".join(skipped))
    # every exportable approved bucket of the files touched, so a file is never a partial table
    touched = {(safe_component(r.kernel_name), _file_name(r)) for r in chosen}
    chosen_ids = {r.rec_id for r in chosen}
    for r in recs:
        if r.rec_id not in chosen_ids and r.review_state == ReviewState.APPROVED and refusal(r, **flags) is None \
                and (safe_component(r.kernel_name), _file_name(r)) in touched:
            chosen.append(r)
    plan = plan_export(chosen)
    approvals = review_states(read_trail(root))
    try:
        files, manifest, ledger = write_files(plan, out, approvals)
    except OSError as exc:
        raise ExportRefused(f"export failed writing under {out}: {exc.strerror or exc}") from None
    record_exports(root, out.resolve(), ledger)
    return ExportResult(tuple(files), tuple(sorted({r.rec_id for r in chosen})), manifest, tuple(skipped))


def _file_name(rec: Recommendation) -> str:
    dims = rec.shape_dims
    return vllm_filename(dims["N"], dims["K"], rec.device_name, vllm_dtype(rec.dtype))
