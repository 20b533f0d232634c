"""Human sign-off: the review CLI, its hash-chained trail, and the approved-only export."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from kernaudit_pipeline.comparisons import build_comparisons
from kernaudit_pipeline.recommendations import export as config_export
from kernaudit_pipeline.recommendations import review, stage
from kernaudit_pipeline.recommendations.advisor import AdvisorSettings
from kernaudit_pipeline.recommendations.model import (
    Action, Recommendation, ReviewState, Verification, VerificationState,
)
from kernaudit_pipeline.recommendations.rules import diagnose_row
from kernaudit_pipeline.recommendations.verify import VerifySettings
from kernaudit_pipeline.spill_diagnostics import diagnose

BASE = dict(kernel_name="gemm_x", device_name="NVIDIA H200", n=4096, k=4096, block_k=64, group_m=8,
            num_stages=3, correct=True, run_status="OK", source_format="runner", baseline_us=100.0)


def _recs() -> list[Recommendation]:
    rows = [
        dict(BASE, shape_name="prefill", m=4096, block_m=128, block_n=256, num_warps=8, latency_us=80.0),
        dict(BASE, shape_name="prefill", m=4096, block_m=64, block_n=64, num_warps=4, latency_us=150.0),
        dict(BASE, shape_name="decode", m=16, block_m=16, block_n=64, block_k=256, group_m=1, num_warps=4,
             num_stages=4, latency_us=50.0),
    ]
    frame = diagnose(build_comparisons(pd.DataFrame(rows)))
    result = stage.run(frame, verify_settings=VerifySettings(max_compiles=0),
                       advisor_settings=AdvisorSettings(enabled=False))
    # the two groups ship; the slower prefill config's own diagnosis keeps the baseline
    return [*result.recommendations, diagnose_row(frame.iloc[1])]


def _by_code(recs: list[Recommendation]) -> dict[str, Recommendation]:
    return {f"{r.shape_name}:{(r.new_config or r.current_config)['block_m']}": r for r in recs}


@pytest.fixture()
def store(tmp_path: Path) -> tuple[Path, dict[str, Recommendation]]:
    recs = _recs()
    review.save_recommendations(recs, tmp_path)
    return tmp_path, _by_code(recs)


def _cli(module, argv: list[str], capsys) -> tuple[int, str, str]:
    code = module.cli(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_recommendations_start_pending_and_round_trip(store):
    root, recs = store
    loaded = review.load_recommendations(root)
    assert {r.rec_id for r in loaded} == {r.rec_id for r in recs.values()}
    assert all(r.review_state == ReviewState.PENDING_REVIEW for r in loaded)
    assert loaded == [replace(r) for r in _recs()]


def test_approve_and_reject_append_to_the_trail(store, capsys):
    root, recs = store
    adopt = recs["prefill:128"]
    code, out, _ = _cli(review, ["--data-dir", str(root), "approve", adopt.rec_id, "--reviewer", "kernel lead",
                                 "--comment", "matches the H200 table"], capsys)
    assert code == 0 and f"{adopt.rec_id} APPROVED by kernel lead" in out
    code, _, _ = _cli(review, ["--data-dir", str(root), "reject", recs["prefill:64"].rec_id, "--reviewer", "b",
                               "--comment", "no"], capsys)
    assert code == 0
    states = {r.rec_id: r.review_state for r in review.load_recommendations(root)}
    assert states[adopt.rec_id] == ReviewState.APPROVED
    assert states[recs["prefill:64"].rec_id] == ReviewState.REJECTED
    assert states[recs["decode:16"].rec_id] == ReviewState.PENDING_REVIEW
    lines = (root / "review_trail.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert set(first) == {"rec_id", "decision", "reviewer", "comment", "timestamp_utc", "prev_sha256",
                          "entry_sha256"}
    assert first["prev_sha256"] == "0" * 64 and first["timestamp_utc"].endswith("+00:00")
    # the last decision wins
    _cli(review, ["--data-dir", str(root), "reject", adopt.rec_id, "--reviewer", "c", "--comment", "regressed"],
         capsys)
    assert {r.rec_id: r.review_state for r in review.load_recommendations(root)}[adopt.rec_id] == "REJECTED"
    code, out, _ = _cli(review, ["--data-dir", str(root), "list", "--state", "REJECTED"], capsys)
    assert code == 0 and adopt.rec_id in out and recs["decode:16"].rec_id not in out


def test_unknown_id_is_a_one_line_error_with_exit_2(store, capsys):
    root, _ = store
    code, out, err = _cli(review, ["--data-dir", str(root), "approve", "rec-000000000000", "--reviewer", "a",
                                   "--comment", "x"], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "unknown recommendation id 'rec-000000000000'" in err
    assert not (root / "review_trail.jsonl").exists() or (root / "review_trail.jsonl").read_text() == ""


def test_missing_arguments_exit_2_without_usage_dump(store, capsys):
    root, recs = store
    with pytest.raises(SystemExit) as exc:
        review.cli(["--data-dir", str(root), "approve", recs["decode:16"].rec_id, "--comment", "x"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("tamper", ["edit_comment", "edit_and_rehash", "delete_first", "swap"])
def test_trail_hash_chain_detects_tampering(store, capsys, tamper):
    root, recs = store
    for key, who in (("prefill:128", "a"), ("prefill:64", "b"), ("decode:16", "c")):
        assert review.cli(["--data-dir", str(root), "approve", recs[key].rec_id, "--reviewer", who,
                           "--comment", "ok"]) == 0
    path = root / "review_trail.jsonl"
    lines = path.read_text().splitlines()
    assert len(review.read_trail(root)) == 3
    if tamper == "edit_comment":
        entry = json.loads(lines[1])
        entry["comment"] = "rubber stamp"
        lines[1] = json.dumps(entry, sort_keys=True, separators=(",", ":"))
    elif tamper == "edit_and_rehash":  # a forger who recomputes the entry's own hash
        entry = json.loads(lines[0])
        entry["decision"] = "REJECTED"
        entry["entry_sha256"] = review._entry_hash(entry)
        lines[0] = json.dumps(entry, sort_keys=True, separators=(",", ":"))
    elif tamper == "delete_first":
        lines = lines[1:]
    else:
        lines[0], lines[1] = lines[1], lines[0]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(review.TrailTampered):
        review.read_trail(root)
    capsys.readouterr()
    code, _, err = _cli(review, ["--data-dir", str(root), "verify"], capsys)
    assert code == 1 and "trail" in err
    code, _, err = _cli(review, ["--data-dir", str(root), "approve", recs["decode:16"].rec_id, "--reviewer",
                                 "d", "--comment", "x"], capsys)
    assert code == 1  # a broken trail is never extended
    code, _, _ = _cli(config_export, ["--data-dir", str(root)], capsys)
    assert code == 1  # nor exported from


def test_export_refuses_unapproved_and_writes_nothing(store, capsys):
    root, recs = store
    code, out, err = _cli(config_export, ["--data-dir", str(root), recs["prefill:128"].rec_id], capsys)
    assert code == 1 and out == ""
    assert "PENDING_REVIEW, not APPROVED" in err and err.count("\n") == 1
    code, _, err = _cli(config_export, ["--data-dir", str(root)], capsys)
    assert code == 1 and "no APPROVED recommendations (3 pending review)" in err
    assert not (root / "exports").exists()


def test_export_accepts_approved_into_vllm_json_under_the_data_folder(store, capsys):
    root, recs = store
    prefill, decode = recs["prefill:128"], recs["decode:16"]
    assert prefill.action == Action.ADOPT and decode.action == Action.ADOPT
    for rec in (prefill, decode):
        assert review.cli(["--data-dir", str(root), "approve", rec.rec_id, "--reviewer", "lead",
                           "--comment", "measured on H200"]) == 0
    code, out, err = _cli(config_export, ["--data-dir", str(root)], capsys)
    assert code == 0, err
    path = root / "exports" / "gemm_x" / "N=4096,K=4096,device_name=NVIDIA_H200.json"
    assert str(path) in out
    assert json.loads(path.read_text()) == {
        "16": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 1, "num_warps": 4,
               "num_stages": 4},
        "4096": {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8,
                 "num_warps": 8, "num_stages": 3},
    }
    manifest = json.loads((root / "exports" / "manifest.json").read_text())
    assert {a["rec_id"]: a["reviewer"] for a in manifest["approvals"]} == {prefill.rec_id: "lead",
                                                                          decode.rec_id: "lead"}
    # --out elsewhere is the user's explicit choice
    other = root.parent / f"{root.name}-vllm"
    assert config_export.cli(["--data-dir", str(root), "--out", str(other), decode.rec_id]) == 0
    assert json.loads((other / "gemm_x" / path.name).read_text()).keys() == {"16"}


def test_export_refuses_an_approved_recommendation_without_a_config(store, capsys):
    root, recs = store
    keep = recs["prefill:64"]
    assert keep.action == Action.KEEP_BASELINE
    assert review.cli(["--data-dir", str(root), "approve", keep.rec_id, "--reviewer", "a", "--comment", "ok"]) == 0
    code, _, err = _cli(config_export, ["--data-dir", str(root), keep.rec_id], capsys)
    assert code == 1 and "proposes no kernel config" in err
    # without ids: the approved configs are exported and the approved no-config decision is listed as skipped
    adopt = recs["decode:16"]
    assert review.cli(["--data-dir", str(root), "approve", adopt.rec_id, "--reviewer", "a", "--comment", "ok"]) == 0
    code, out, err = _cli(config_export, ["--data-dir", str(root)], capsys)
    assert code == 0 and "exported 1 approved recommendation(s)" in out
    assert f"skipped: {keep.rec_id}" in err


def test_refuted_recommendations_cannot_be_approved(tmp_path, capsys):
    rec = _recs()[0]
    refuted = replace(rec, verification=Verification(state=VerificationState.REFUTED, note="still spills 808 B"))
    review.save_recommendations([refuted], tmp_path)
    code, _, err = _cli(review, ["--data-dir", str(tmp_path), "approve", rec.rec_id, "--reviewer", "a",
                                 "--comment", "ship it"], capsys)
    assert code == 1 and "REFUTED" in err and "still spills 808 B" in err


def test_conflicting_approvals_for_one_m_are_refused(tmp_path):
    rec = _recs()[0]
    twin = replace(rec, rec_id="rec-" + "a" * 12, new_config=dict(rec.new_config, num_warps=4))
    approved = [replace(r, review_state=ReviewState.APPROVED) for r in (rec, twin)]
    with pytest.raises(config_export.ExportRefused, match="both set M=4096"):
        config_export.export_vllm_configs(approved, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_corrupt_store_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "recommendations.json").write_text(json.dumps({"schema_version": 1, "recommendations": [{}]}))
    code, _, err = _cli(review, ["--data-dir", str(tmp_path), "list"], capsys)
    assert code == 1 and "invalid recommendations store" in err and err.count("\n") == 1
