"""Human sign-off and the vLLM export: the CLI, the content-bound hash-chained trail with its head
in the history DB, rejections that reach exported files, and exports that stay home."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from kernaudit_pipeline import cli
from kernaudit_pipeline.comparisons import build_comparisons
from kernaudit_pipeline.recommendations import export as config_export
from kernaudit_pipeline.recommendations import review, stage
from kernaudit_pipeline.recommendations.advisor import AdvisorSettings
from kernaudit_pipeline.recommendations.model import (
    Action, Recommendation, ReviewState, Verification, VerificationState, content_sha256,
)
from kernaudit_pipeline.recommendations.rules import diagnose_row
from kernaudit_pipeline.recommendations.verify import VerifySettings
from kernaudit_pipeline.spill_diagnostics import diagnose

V = VerificationState
BASE = dict(kernel_name="gemm_x", device_name="NVIDIA H200", n=4096, k=4096, block_k=64, group_m=8,
            num_stages=3, correct=True, run_status="OK", source_format="runner", baseline_us=100.0, dtype="bf16")


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


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def _approve(root: Path, rec: Recommendation, who: str = "lead", capsys=None) -> None:
    assert cli.main(["review", "approve", rec.rec_id, "--reviewer", who, "--comment", "measured on H200",
                     "--data-dir", str(root)]) == 0


def test_recommendations_start_pending_and_round_trip(store):
    root, recs = store
    loaded = review.load_recommendations(root)
    assert {r.rec_id for r in loaded} == {r.rec_id for r in recs.values()}
    assert all(r.review_state == ReviewState.PENDING_REVIEW for r in loaded)
    assert loaded == [replace(r) for r in _recs()]
    assert [content_sha256(r) for r in loaded] == [content_sha256(r) for r in _recs()]


def test_approve_and_reject_append_content_bound_entries(store, capsys):
    root, recs = store
    adopt = recs["prefill:128"]
    code, out, _ = _cli(["review", "approve", adopt.rec_id, "--reviewer", "kernel lead", "--comment",
                         "matches the H200 table", "--data-dir", str(root)], capsys)
    assert code == 0 and f"{adopt.rec_id} APPROVED by kernel lead" in out
    code, _, _ = _cli(["review", "--data-dir", str(root), "reject", recs["prefill:64"].rec_id, "--reviewer", "b",
                       "--comment", "no"], capsys)
    assert code == 0  # --data-dir before the action works too
    states = {r.rec_id: r.review_state for r in review.load_recommendations(root)}
    assert states[adopt.rec_id] == ReviewState.APPROVED
    assert states[recs["prefill:64"].rec_id] == ReviewState.REJECTED
    assert states[recs["decode:16"].rec_id] == ReviewState.PENDING_REVIEW
    lines = (root / "review_trail.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert set(first) == {"rec_id", "decision", "reviewer", "comment", "timestamp_utc", "content_sha256",
                          "prev_sha256", "entry_sha256"}
    assert first["content_sha256"] == content_sha256(adopt)
    assert first["prev_sha256"] == "0" * 64 and first["timestamp_utc"].endswith("+00:00")
    assert review.recorded_head(root)[0] == 2  # the head lives in the history DB too
    # the last decision wins
    _cli(["review", "reject", adopt.rec_id, "--reviewer", "c", "--comment", "regressed", "--data-dir", str(root)],
         capsys)
    assert {r.rec_id: r.review_state for r in review.load_recommendations(root)}[adopt.rec_id] == "REJECTED"
    code, out, _ = _cli(["review", "list", "--state", "REJECTED", "--data-dir", str(root)], capsys)
    assert code == 0 and adopt.rec_id in out and recs["decode:16"].rec_id not in out


def test_unknown_id_is_a_one_line_error_with_exit_2(store, capsys):
    root, _ = store
    code, out, err = _cli(["review", "approve", "rec-000000000000", "--reviewer", "a", "--comment", "x",
                           "--data-dir", str(root)], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "unknown recommendation id 'rec-000000000000'" in err
    assert not (root / "review_trail.jsonl").exists() or (root / "review_trail.jsonl").read_text() == ""


def test_missing_arguments_exit_2_without_usage_dump(store, capsys):
    root, recs = store
    code, _, err = _cli(["review", "approve", recs["decode:16"].rec_id, "--comment", "x", "--data-dir", str(root)],
                        capsys)
    assert code == 2 and err.count("\n") == 1 and "--reviewer" in err


@pytest.mark.parametrize("tamper", ["edit_comment", "edit_and_rehash", "delete_first", "swap", "delete_last",
                                    "rehash_whole_chain_minus_last", "head_db_removed"])
def test_an_edited_or_truncated_trail_is_refused(store, capsys, tamper):
    root, recs = store
    for key, who in (("prefill:128", "a"), ("prefill:64", "b"), ("decode:16", "c")):
        _approve(root, recs[key], who)
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
    elif tamper == "swap":
        lines[0], lines[1] = lines[1], lines[0]
    elif tamper in ("delete_last", "rehash_whole_chain_minus_last"):
        lines = lines[:-1]  # a valid chain, one decision short of what was recorded
    else:
        (root / "history.duckdb").unlink()
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(review.TrailTampered):
        review.read_trail(root)
    capsys.readouterr()
    code, _, err = _cli(["review", "verify", "--data-dir", str(root)], capsys)
    assert code == 1 and "trail" in err and err.count("\n") == 1
    code, _, _ = _cli(["review", "approve", recs["decode:16"].rec_id, "--reviewer", "d", "--comment", "x",
                       "--data-dir", str(root)], capsys)
    assert code == 1  # a broken trail is never extended
    code, _, _ = _cli(["export", "--data-dir", str(root)], capsys)
    assert code == 1  # nor exported from
    assert not (root / "exports").exists()


def test_a_deleted_rejection_does_not_re_enable_the_export(store, capsys):
    root, recs = store
    rec = recs["decode:16"]
    _approve(root, rec)
    assert cli.main(["review", "reject", rec.rec_id, "--reviewer", "b", "--comment", "no",
                     "--data-dir", str(root)]) == 0
    path = root / "review_trail.jsonl"
    path.write_text(path.read_text().splitlines()[0] + "\n")  # drop the rejection
    code, _, err = _cli(["export", rec.rec_id, "--data-dir", str(root)], capsys)
    assert code == 1 and "truncated" in err and not (root / "exports").exists()


def test_editing_the_store_after_approval_is_refused(store, capsys):
    root, recs = store
    rec = recs["prefill:128"]
    _approve(root, rec)
    data = json.loads((root / "recommendations.json").read_text())
    for item in data["recommendations"]:
        if item["rec_id"] == rec.rec_id:
            item["new_config"].update(block_m=128, block_n=64, num_warps=2)  # a plausible, unapproved config
    (root / "recommendations.json").write_text(json.dumps(data))
    (edited,) = [r for r in review.load_recommendations(root) if r.rec_id == rec.rec_id]
    assert edited.review_state == ReviewState.STALE
    code, _, err = _cli(["export", rec.rec_id, "--data-dir", str(root)], capsys)
    assert code == 1 and "changed since it was approved" in err
    assert not (root / "exports").exists()


def test_export_refuses_unapproved_and_writes_nothing(store, capsys):
    root, recs = store
    code, out, err = _cli(["export", recs["prefill:128"].rec_id, "--data-dir", str(root)], capsys)
    assert code == 1 and out == ""
    assert "PENDING_REVIEW, not APPROVED" in err and err.count("\n") == 1
    code, _, err = _cli(["export", "--data-dir", str(root)], capsys)
    assert code == 1 and "no APPROVED recommendations (3 pending review)" in err
    assert not (root / "exports").exists()


def test_export_writes_one_vllm_file_with_every_approved_m_bucket(store, capsys):
    root, recs = store
    prefill, decode = recs["prefill:128"], recs["decode:16"]
    assert prefill.action == Action.ADOPT and decode.action == Action.ADOPT
    assert prefill.verification.state == V.VERIFIED  # ran in the sweep (fits), 1.25x the baseline
    for rec in (prefill, decode):
        _approve(root, rec)
    code, out, err = _cli(["export", decode.rec_id, "--data-dir", str(root)], capsys)
    assert code == 0, err
    path = root / "exports" / "gemm_x" / "N=4096,K=4096,device_name=NVIDIA_H200.json"
    assert str(path) in out
    # asked for one id, the file still holds every approved bucket of its (N, K, device, dtype)
    assert json.loads(path.read_text()) == {
        "16": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 1, "num_warps": 4,
               "num_stages": 4},
        "4096": {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8,
                 "num_warps": 8, "num_stages": 3},
    }
    manifest = json.loads((root / "exports" / "manifest.json").read_text())
    assert {a["rec_id"]: (a["reviewer"], a["content_sha256"]) for a in manifest["approvals"]} == {
        prefill.rec_id: ("lead", content_sha256(prefill)), decode.rec_id: ("lead", content_sha256(decode))}
    # --out elsewhere is the user's explicit choice
    other = root.parent / f"{root.name}-vllm"
    assert cli.main(["export", "--data-dir", str(root), "--out", str(other)]) == 0
    assert json.loads((other / "gemm_x" / path.name).read_text()).keys() == {"16", "4096"}


def test_a_rejection_takes_its_entries_out_of_earlier_exports(store, capsys):
    root, recs = store
    prefill, decode = recs["prefill:128"], recs["decode:16"]
    for rec in (prefill, decode):
        _approve(root, rec)
    other = root.parent / f"{root.name}-elsewhere"
    assert cli.main(["export", "--data-dir", str(root)]) == 0
    assert cli.main(["export", "--data-dir", str(root), "--out", str(other)]) == 0
    name = "N=4096,K=4096,device_name=NVIDIA_H200.json"
    code, out, _ = _cli(["review", "reject", prefill.rec_id, "--reviewer", "b", "--comment", "regressed",
                         "--data-dir", str(root)], capsys)
    assert code == 0 and out.count("revoked its entries") == 2
    for folder in (root / "exports", other):
        assert json.loads((folder / "gemm_x" / name).read_text()).keys() == {"16"}
        manifest = json.loads((folder / "manifest.json").read_text())
        assert prefill.rec_id not in {a["rec_id"] for a in manifest["approvals"]}
        assert manifest["revoked"][0]["rec_id"] == prefill.rec_id
    assert cli.main(["review", "reject", decode.rec_id, "--reviewer", "b", "--comment", "no",
                     "--data-dir", str(root)]) == 0
    assert not (root / "exports" / "gemm_x" / name).exists() and not (other / "gemm_x" / name).exists()


def test_export_refuses_an_approved_recommendation_without_a_config(store, capsys):
    root, recs = store
    keep = recs["prefill:64"]
    assert keep.action == Action.KEEP_BASELINE
    _approve(root, keep)
    code, _, err = _cli(["export", keep.rec_id, "--data-dir", str(root)], capsys)
    assert code == 1 and "proposes no kernel config" in err
    # without ids: the approved configs are exported and the approved no-config decision is listed as skipped
    _approve(root, recs["decode:16"])
    code, out, err = _cli(["export", "--data-dir", str(root)], capsys)
    assert code == 0 and "exported 1 approved recommendation(s)" in out
    assert f"skipped: {keep.rec_id}" in err


def _signed(root: Path, rec: Recommendation) -> Recommendation:
    review.save_recommendations([rec], root)
    _approve(root, rec)
    return rec


def test_a_config_measured_slower_than_the_baseline_needs_allow_slower(tmp_path, capsys):
    """The case that shipped once: a "VERIFIED" config at 0.925x the baseline."""
    rec = _recs()[0]
    slow = replace(rec, verification=replace(rec.verification, state=V.REFUTED, faster_than_baseline=V.REFUTED,
                                             speedup_new=0.925, note="vs baseline: 0.925x: slower"))
    _signed(tmp_path, slow)
    code, _, err = _cli(["export", "--data-dir", str(tmp_path)], capsys)
    assert code == 1 and "measured slower than the baseline (0.925x)" in err and "--allow-slower" in err
    assert not (tmp_path / "exports").exists()
    assert cli.main(["export", "--allow-slower", "--data-dir", str(tmp_path)]) == 0


def test_an_unverified_config_needs_allow_unverified(tmp_path, capsys):
    rec = _recs()[0]
    unverified = replace(rec, verification=replace(rec.verification, state=V.UNVERIFIED, fits=V.UNVERIFIED))
    _signed(tmp_path, unverified)
    code, _, err = _cli(["export", "--data-dir", str(tmp_path)], capsys)
    assert code == 1 and "UNVERIFIED" in err and "--allow-unverified" in err
    assert cli.main(["export", "--allow-unverified", "--data-dir", str(tmp_path)]) == 0


def test_a_tile_outside_physical_bounds_is_never_exported(tmp_path, capsys):
    rec = _recs()[0]
    huge = replace(rec, new_config=dict(rec.new_config, block_m=4096, block_n=4096, block_k=4096),
                   verification=replace(rec.verification, state=V.UNVERIFIED, fits=V.UNVERIFIED))
    _signed(tmp_path, huge)
    code, _, err = _cli(["export", "--allow-unverified", "--allow-slower", "--data-dir", str(tmp_path)], capsys)
    assert code == 1 and "exceeds what one block can hold" in err


def test_refuted_recommendations_cannot_be_approved(tmp_path, capsys):
    rec = _recs()[0]
    refuted = replace(rec, verification=Verification(state=V.REFUTED, fits=V.REFUTED, note="still spills 808 B"))
    review.save_recommendations([refuted], tmp_path)
    code, _, err = _cli(["review", "approve", rec.rec_id, "--reviewer", "a", "--comment", "ship it",
                         "--data-dir", str(tmp_path)], capsys)
    assert code == 1 and "REFUTED" in err and "still spills 808 B" in err


def test_conflicting_approvals_for_one_m_are_refused(tmp_path):
    rec = _recs()[0]
    twin = replace(rec, rec_id="rec-" + "a" * 12, new_config=dict(rec.new_config, num_warps=4))
    approved = [replace(r, review_state=ReviewState.APPROVED) for r in (rec, twin)]
    with pytest.raises(config_export.ExportRefused, match="both set M=4096"):
        config_export.plan_export(approved)


@pytest.mark.parametrize("content", ["{\"schema_version\": 2, \"recommendations\": [{}]}", b"\xff\xfe\x00binary",
                                     "caf\xe9".encode("latin-1"), "[1, 2]", "[" * 5000])
def test_a_corrupt_store_is_a_one_line_error(tmp_path, capsys, content):
    path = tmp_path / "recommendations.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    for argv in (["review", "list"], ["export"], ["review", "approve", "rec-0123456789ab", "--reviewer", "a",
                                                 "--comment", "x"]):
        code, _, err = _cli([*argv, "--data-dir", str(tmp_path)], capsys)
        assert code == 1 and err.count("\n") == 1 and "Traceback" not in err


def test_export_out_that_is_a_file_is_refused(store, capsys):
    root, recs = store
    _approve(root, recs["decode:16"])
    target = root / "a-file"
    target.write_text("x")
    code, _, err = _cli(["export", "--data-dir", str(root), "--out", str(target)], capsys)
    assert code == 1 and "is not a folder" in err and target.read_text() == "x"


HOSTILE_KERNELS = ["..", "../escaped_kernel", "../../etc", "/tmp/absolute_kernel", "a\x00b", "line\nbreak",
                   "x" * 5000, ".hidden", "sub/dir", "C:\\windows", "ünïcode-kernel", ""]


@pytest.mark.parametrize("kernel", HOSTILE_KERNELS)
def test_exports_stay_under_the_export_root_whatever_the_kernel_is_called(tmp_path, kernel):
    rec = _recs()[0]
    hostile = replace(rec, kernel_name=kernel or "k")
    root = tmp_path / "data"
    _signed(root, hostile)
    before = {p for p in tmp_path.rglob("*")}
    result = config_export.export_approved(root)
    out = (root / "exports").resolve()
    (path,) = result.files
    assert path.resolve().is_relative_to(out) and path.parent.parent == out
    name = path.parent.name
    assert name not in (".", "..") and "/" not in name and "\x00" not in name and "\n" not in name
    assert len(name) <= config_export.MAX_COMPONENT
    created = {p for p in tmp_path.rglob("*")} - before
    assert all(p.resolve().is_relative_to(root.resolve()) for p in created)


@pytest.mark.parametrize(("device", "spelled"), [
    ("../../etc", None), ("a\x00b", None), (".", None), ("x" * 400, None), ("a;b", None),
    # vLLM's own spelling turns whitespace and "/" runs into "_": these become safe names
    ("/dev/null", "_dev_null"), ("NVIDIA H200\n", "NVIDIA_H200"),
])
def test_device_names_are_spelled_as_vllm_does_or_refused(tmp_path, capsys, device, spelled):
    rec = _recs()[0]
    root = tmp_path / "data"
    _signed(root, replace(rec, device_name=device))
    code, out, err = _cli(["export", "--data-dir", str(root)], capsys)
    written = [p for p in tmp_path.rglob("N=*")]
    if spelled:
        assert code == 0 and [p.name for p in written] == [f"N=4096,K=4096,device_name={spelled}.json"]
        assert written[0].resolve().is_relative_to((root / "exports").resolve())
        return
    assert code == 1 and "file name" in err and err.count("\n") == 1
    assert written == [] and not (root / "exports").exists()


def test_safe_component():
    assert config_export.safe_component("gemm_bf16") == "gemm_bf16"
    for raw in HOSTILE_KERNELS:
        safe = config_export.safe_component(raw)
        assert safe and not safe.startswith(".") and len(safe) <= config_export.MAX_COMPONENT
        assert config_export.SAFE_CHARS.search(safe) is None
    assert config_export.safe_component("a/b") != config_export.safe_component("a_b")  # no collisions by cleaning
