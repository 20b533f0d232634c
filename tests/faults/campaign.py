"""A malformed-input campaign over every entry point of the ``kernaudit`` command.

Each :class:`Case` builds its bad input in a scratch folder (nothing is committed), then runs
one ``kernaudit`` command on it (``tests/faults/runner.py`` runs them in worker processes and
records a case that stops answering as a hang). What each case must show:

- no Python traceback on stdout or stderr, and not the CLI's last-resort "internal error";
- a non-zero exit with exactly one line on stderr, or a zero exit (a file with some bad records
  is still ingested: the rest is kept and the bad ones quarantined);
- where the case knows how many records it wrote, records in = kept + quarantined + skipped;
- nothing written outside the case's data folder and ``--out``.

``scripts/fault_campaign.py`` prints the table; ``tests/faults/test_campaign.py`` asserts it.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "samples" / "h200"
SEED_ITEM = {"kernel_name": "fused_fp8_gemm", "block_m": 64, "block_n": 64, "registers_per_thread": 142,
             "spill_stores_bytes": 2048, "latency_us": 48.2, "baseline_us": 35.1}


@dataclass(frozen=True)
class Case:
    name: str
    command: str
    build: Callable[[Path], list[str]]  # makes the input under the folder, returns argv after "kernaudit"
    records_in: int | None = None  # ingest: how many records the input holds, when known
    allow_success: bool = True  # False: the input is unusable as a whole, the exit must be non-zero
    slow: bool = False  # runs a whole audit (tens of seconds)


@dataclass
class Outcome:
    name: str
    command: str
    exit_code: int | None
    stderr_lines: int
    traceback: bool
    internal_error: bool
    hang: bool
    rows_accounted: bool | None
    wrote_outside: bool
    seconds: float
    detail: str = ""
    problems: list[str] = field(default_factory=list)

    def judge(self, case: Case) -> "Outcome":
        p = []
        if self.hang:
            p.append("hang")
        if self.traceback:
            p.append("traceback")
        if self.internal_error:
            p.append("internal error (unhandled exception)")
        if self.exit_code not in (None, 0) and self.stderr_lines != 1:
            p.append(f"{self.stderr_lines} lines on stderr, not one")
        if self.exit_code == 0 and not case.allow_success:
            p.append("accepted an unusable input")
        if self.rows_accounted is False:
            p.append("rows lost")
        if self.wrote_outside:
            p.append("wrote outside the data folder / --out")
        self.problems = p
        return self


# ---------------------------------------------------------------------------------------------
# Input builders
# ---------------------------------------------------------------------------------------------
def _w(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data, encoding="utf-8")
    return path


def _nested(depth: int, open_: str = "[", close: str = "]") -> str:
    return open_ * depth + close * depth


def _nested_obj(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def _runner_row(**over) -> dict:
    row = {"record_type": "run", "kernel_name": "gemm_bf16", "config_id": "BK64_BM128_BN128_GM8_s3_w4",
           "shape_name": "s", "block_m": 128, "block_n": 128, "block_k": 64, "group_m": 8, "num_warps": 4,
           "num_stages": 3, "m": 512, "n": 512, "k": 512, "latency_us": 12.5, "baseline_us": 13.0,
           "correct": True, "run_status": "OK", "device_name": "NVIDIA H200", "compute_capability": "9.0"}
    row.update(over)
    return row


def _jsonl(rows: list[object]) -> str:
    return "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n"


def _ingest(d: Path, path: Path) -> list[str]:
    return ["ingest", str(path), "--out", str(d / "out")]


def _file_cases() -> list[tuple[str, Callable[[Path], Path], int | None, bool]]:
    """(name, builder -> path, records_in, allow_success) for files fed to ingest and assess."""
    big = "9" * 400
    cases: list[tuple[str, Callable[[Path], Path], int | None, bool]] = [
        ("empty file", lambda d: _w(d / "empty.json", ""), None, False),
        ("whitespace only", lambda d: _w(d / "ws.json", " \n\t \n"), None, False),
        ("binary garbage", lambda d: _w(d / "bin.json", bytes(range(256)) * 64), None, False),
        ("NUL bytes in JSON", lambda d: _w(d / "nul.json", b'[{"kernel_name": "a\x00b"}]\x00\x00'), None, True),
        ("latin-1 text", lambda d: _w(d / "latin1.json", '[{"kernel_name": "caf\xe9"}]'.encode("latin-1")), None, True),
        ("UTF-16 with BOM", lambda d: _w(d / "u16.json", json.dumps([SEED_ITEM]).encode("utf-16")), None, True),
        ("UTF-8 BOM", lambda d: _w(d / "bom.json", b"\xef\xbb\xbf" + json.dumps([SEED_ITEM]).encode()), 1, True),
        ("truncated JSON", lambda d: _w(d / "trunc.json", json.dumps([SEED_ITEM] * 3)[:-25]), None, False),
        ("3000-deep array", lambda d: _w(d / "deep.json", _nested(3000)), None, False),
        ("100000-deep array", lambda d: _w(d / "deeper.json", _nested(100_000)), None, False),
        ("3000-deep object", lambda d: _w(d / "deepobj.json", _nested_obj(3000)), None, False),
        ("deep value inside a seed item",
         lambda d: _w(d / "deepval.json", '[{"input": {"kernel_name": "k", "latency_us": ' + _nested(3000) + "}}]"),
         1, True),
        ("10^400 integer latency", lambda d: _w(d / "bigint.json", '[{"kernel_name": "k", "latency_us": ' + big
                                               + ', "baseline_us": 2}]'), 1, True),
        ("10^400 integer block_m", lambda d: _w(d / "bigblock.json", '[{"kernel_name": "k", "block_m": ' + big
                                               + ', "latency_us": 1, "baseline_us": 2}]'), 1, True),
        ("1e400 float", lambda d: _w(d / "bigfloat.json", '[{"kernel_name": "k", "latency_us": 1e400, '
                                                          '"baseline_us": 2}]'), 1, True),
        ("NaN literal", lambda d: _w(d / "nan.json", '[{"kernel_name": "k", "latency_us": NaN, "baseline_us": 2}]'),
         1, True),
        ("Infinity literal", lambda d: _w(d / "inf.json", '[{"kernel_name": "k", "latency_us": Infinity, '
                                                         '"baseline_us": 2}]'), 1, True),
        ("boolean latency", lambda d: _w(d / "bool.json", json.dumps([{**SEED_ITEM, "latency_us": True}])), 1, True),
        ("string latency", lambda d: _w(d / "str.json", json.dumps([{**SEED_ITEM, "latency_us": "fast"}])), 1, True),
        ("negative latency", lambda d: _w(d / "neg.json", json.dumps([{**SEED_ITEM, "latency_us": -3.0}])), 1, True),
        ("zero baseline", lambda d: _w(d / "zero.json", json.dumps([{**SEED_ITEM, "baseline_us": 0}])), 1, True),
        ("1e-300 latency", lambda d: _w(d / "tiny.json", json.dumps([{**SEED_ITEM, "latency_us": 1e-300}])), 1, True),
        ("1e308 latency", lambda d: _w(d / "huge.json", json.dumps([{**SEED_ITEM, "latency_us": 1e308}])), 1, True),
        ("7x3 tile", lambda d: _w(d / "tile73.json", json.dumps([{**SEED_ITEM, "block_m": 7, "block_n": 3}])), 1, True),
        ("negative tile", lambda d: _w(d / "tileneg.json", json.dumps([{**SEED_ITEM, "block_m": -128}])), 1, True),
        ("zero tile", lambda d: _w(d / "tile0.json", json.dumps([{**SEED_ITEM, "block_n": 0}])), 1, True),
        ("float tile", lambda d: _w(d / "tilef.json", json.dumps([{**SEED_ITEM, "block_m": 64.5}])), 1, True),
        ("3 warps", lambda d: _w(d / "warps3.json", json.dumps([{**SEED_ITEM, "num_warps": 3}])), 1, True),
        ("registers 300", lambda d: _w(d / "regs.json", json.dumps([{**SEED_ITEM, "registers_per_thread": 300}])),
         1, True),
        ("kernel_name null", lambda d: _w(d / "kn.json", json.dumps([{**SEED_ITEM, "kernel_name": None}])), 1, True),
        ("kernel_name list", lambda d: _w(d / "kl.json", json.dumps([{**SEED_ITEM, "kernel_name": ["a"]}])), 1, True),
        ("kernel_name 100 kB", lambda d: _w(d / "klong.json", json.dumps([{**SEED_ITEM, "kernel_name": "k" * 100_000}])),
         1, True),
        ("kernel name with path", lambda d: _w(d / "kpath.json", json.dumps([{**SEED_ITEM,
                                                                          "kernel_name": "../../etc/x"}])), 1, True),
        ("kernel name with newline", lambda d: _w(d / "knl.json", json.dumps([{**SEED_ITEM, "kernel_name": "a\nb"}])),
         1, True),
        ("top-level null", lambda d: _w(d / "null.json", "null"), None, False),
        ("top-level number", lambda d: _w(d / "num.json", "42"), None, False),
        ("top-level string", lambda d: _w(d / "s.json", '"hello"'), None, False),
        ("array of numbers", lambda d: _w(d / "nums.json", "[1, 2, 3]"), 3, True),
        ("array of arrays", lambda d: _w(d / "arrs.json", "[[1], [2]]"), 2, True),
        ("empty array", lambda d: _w(d / "emptyarr.json", "[]"), 0, True),
        ("empty object", lambda d: _w(d / "emptyobj.json", "{}"), None, True),
        ("duplicate keys", lambda d: _w(d / "dup.json", '[{"kernel_name": "k", "latency_us": 1, "latency_us": "x", '
                                                        '"baseline_us": 2}]'), 1, True),
        ("one mistyped item among good ones",
         lambda d: _w(d / "mixed.json", json.dumps([SEED_ITEM, {**SEED_ITEM, "block_m": "sixty-four"}, SEED_ITEM])),
         3, True),
        ("input wrapper not an object", lambda d: _w(d / "wrap.json", json.dumps([{"input": [1, 2]}])), 1, True),
        ("CRLF line endings", lambda d: _w(d / "crlf.json", json.dumps([SEED_ITEM], indent=1).replace("\n", "\r\n")),
         1, True),
        ("gzip of garbage", lambda d: _w(d / "g.json.gz", gzip.compress(bytes(range(256)) * 10)), None, False),
        ("truncated gzip", lambda d: _w(d / "t.json.gz", gzip.compress(json.dumps([SEED_ITEM] * 50).encode())[:60]),
         None, False),
        ("gzip of a seed array", lambda d: _w(d / "ok.json.gz", gzip.compress(json.dumps([SEED_ITEM]).encode())), 1, True),
        ("gzip bomb (64 MiB of spaces)", lambda d: _w(d / "bomb.json.gz", gzip.compress(b"[" + b" " * (64 << 20) + b"]")),
         0, True),
    ]
    return cases


def _runner_cases() -> list[tuple[str, Callable[[Path], Path], int | None, bool]]:
    big = "9" * 400
    return [
        ("runner: one good row", lambda d: _w(d / "r1.jsonl", _jsonl([_runner_row()])), 1, True),
        ("runner: bad JSON line among good", lambda d: _w(d / "r2.jsonl", _jsonl([_runner_row(), "{oops", _runner_row()])),
         3, True),
        ("runner: 10^400 integer", lambda d: _w(d / "r3.jsonl", _jsonl([_runner_row(), '{"record_type": "run", '
                                                                       '"kernel_name": "g", "m": ' + big + "}"])), 2, True),
        ("runner: 3000-deep line", lambda d: _w(d / "r4.jsonl", _jsonl([_runner_row(), _nested(3000)])), 2, True),
        ("runner: latency 1e308 ms-scale", lambda d: _w(d / "r5.jsonl", _jsonl([_runner_row(latency_us=1e308)])), 1, True),
        ("runner: boolean latency", lambda d: _w(d / "r6.jsonl", _jsonl([_runner_row(latency_us=True)])), 1, True),
        ("runner: string numbers", lambda d: _w(d / "r7.jsonl", _jsonl([_runner_row(latency_us="12.5")])), 1, True),
        ("runner: unknown record_type", lambda d: _w(d / "r8.jsonl", _jsonl([_runner_row(record_type="mystery")])),
         1, True),
        ("runner: missing kernel_name", lambda d: _w(d / "r9.jsonl", _jsonl([{k: v for k, v in _runner_row().items()
                                                                              if k != "kernel_name"}])), 1, True),
        ("runner: line is an array", lambda d: _w(d / "r10.jsonl", _jsonl([_runner_row(), "[1,2]"])), 2, True),
        ("runner: CI excludes median", lambda d: _w(d / "r11.jsonl", _jsonl([_runner_row(
            latency_ci_low_us=20.0, latency_ci_high_us=30.0)])), 1, True),
        ("runner: 7 warps", lambda d: _w(d / "r12.jsonl", _jsonl([_runner_row(num_warps=7)])), 1, True),
        ("runner: tile 100", lambda d: _w(d / "r13.jsonl", _jsonl([_runner_row(block_m=100)])), 1, True),
        ("runner: latency 0.0001 ns", lambda d: _w(d / "r14.jsonl", _jsonl([_runner_row(latency_us=1e-7)])), 1, True),
        ("runner: latency 2 h", lambda d: _w(d / "r15.jsonl", _jsonl([_runner_row(latency_us=7.2e9)])), 1, True),
        ("runner: blank lines only", lambda d: _w(d / "r16.jsonl", "\n\n\n"), 0, True),
        ("runner: 5000 rows, every 7th bad", lambda d: _w(d / "r17.jsonl", _jsonl(
            [_runner_row(config_id=f"c{i}") if i % 7 else "{bad" for i in range(5000)])), 5000, True),
        ("runner: speedup CI excludes speedup", lambda d: _w(d / "r18.jsonl", _jsonl([_runner_row(
            speedup=1.04, speedup_ci_low=1.2, speedup_ci_high=1.3)])), 1, True),
    ]


def _ncu_csv(rows: list[list[str]]) -> str:
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL).writerows(rows)
    return buf.getvalue()


def _ncu_cases() -> list[tuple[str, Callable[[Path], Path], int | None, bool]]:
    head = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
            "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]

    def launch(i: int, name: str, unit: str, value: str) -> list[str]:
        return [str(i), "1", "python", "h", "gemm_kernel", "1", "7", "(256, 1, 1)", "(1024, 1, 1)", "0", "9.0",
                "GPU Speed Of Light Throughput", name, unit, value]

    def details(rows: list[list[str]]) -> str:
        return _ncu_csv([head, *rows])

    return [
        ("ncu details: header only", lambda d: _w(d / "n1.csv", details([])), 0, True),
        ("ncu details: duration in usecond", lambda d: _w(d / "n2.csv", details([launch(0, "Duration", "usecond",
                                                                                        "12.5")])), 1, True),
        ("ncu details: cycle/second frequency", lambda d: _w(d / "n3.csv", details([
            launch(0, "Duration", "nsecond", "12500"), launch(0, "SM Frequency", "cycle/second", "1.98e9")])), 1, True),
        ("ncu details: unknown unit", lambda d: _w(d / "n4.csv", details([launch(0, "Duration", "fortnight", "1")])),
         1, True),
        ("ncu details: value is text", lambda d: _w(d / "n5.csv", details([launch(0, "Duration", "usecond", "n/a")])),
         1, True),
        ("ncu details: value 1e400", lambda d: _w(d / "n6.csv", details([launch(0, "Duration", "usecond", "1e400")])),
         1, True),
        ("ncu details: thousands separators", lambda d: _w(d / "n7.csv", details([
            launch(0, "Duration", "nsecond", "12,500")])), 1, True),
        ("ncu details: ragged rows", lambda d: _w(d / "n8.csv", details([launch(0, "Duration", "usecond", "1")[:6]])),
         1, True),
        ("ncu details: two launches, one garbled", lambda d: _w(d / "n9.csv", details([
            launch(0, "Duration", "usecond", "1.5"), launch(1, "Duration", "usecond", "x")])), 2, True),
        ("ncu raw: duplicated duration column", lambda d: _w(d / "n10.csv", _ncu_csv([
            ["ID", "Kernel Name", "Device", "CC", "gpu__time_duration.sum", "gpu__time_duration.sum"],
            ["", "", "", "", "nsecond", "nsecond"], ["0", "k", "NVIDIA H200", "9.0", "1000", "5"]])), 1, True),
        ("ncu raw: units row missing", lambda d: _w(d / "n11.csv", _ncu_csv([
            ["ID", "Kernel Name", "gpu__time_duration.sum"], ["0", "k", "1000"]])), 1, True),
        ("ncu raw: only a header", lambda d: _w(d / "n12.csv", _ncu_csv([["ID", "Kernel Name",
                                                                         "gpu__time_duration.sum"]])), 0, True),
        ("ncu: preamble lines then CSV", lambda d: _w(d / "n13.csv", "==PROF== Connected\n==PROF== Disconnected\n"
                                                      + details([launch(0, "Duration", "usecond", "2")])), 1, True),
        ("csv: not ncu at all", lambda d: _w(d / "n14.csv", "a,b,c\n1,2,3\n"), None, False),
        ("csv: 10 MB single field", lambda d: _w(d / "n15.csv", '"' + "x" * (10 << 20) + '"\n'), None, False),
    ]


def _trace_cases() -> list[tuple[str, Callable[[Path], Path], int | None, bool]]:
    def ev(**over) -> dict:
        e = {"ph": "X", "cat": "kernel", "name": "gemm_kernel", "ts": 10, "dur": 5, "pid": 0, "tid": 7,
             "args": {"device": 0, "grid": [1024, 1, 1], "block": [256, 1, 1], "registers per thread": 128,
                      "shared memory": 1024}}
        e.update(over)
        return e

    def trace(events: list[object], **top) -> str:
        return json.dumps({"traceEvents": events, "deviceProperties": [{"id": 0, "name": "NVIDIA H200",
                                                                        "computeMajor": 9, "computeMinor": 0}], **top})

    return [
        ("trace: no events", lambda d: _w(d / "t1.json", trace([])), 0, True),
        ("trace: events not a list", lambda d: _w(d / "t2.json", json.dumps({"traceEvents": {"a": 1}})), None, True),
        ("trace: dur is a string", lambda d: _w(d / "t3.json", trace([ev(dur="5")])), 1, True),
        ("trace: dur negative", lambda d: _w(d / "t4.json", trace([ev(dur=-5)])), 1, True),
        ("trace: dur 0 (integer-µs timer)", lambda d: _w(d / "t5.json", trace([ev(dur=0), ev(dur=1)])), 2, True),
        ("trace: dur boolean", lambda d: _w(d / "t6.json", trace([ev(dur=True)])), 1, True),
        ("trace: args not an object", lambda d: _w(d / "t7.json", trace([ev(args=[1, 2])])), 1, True),
        ("trace: name missing", lambda d: _w(d / "t8.json", trace([{k: v for k, v in ev().items() if k != "name"}])),
         1, True),
        ("trace: event is a number", lambda d: _w(d / "t9.json", trace([ev(), 5])), 2, True),
        ("trace: 3000-deep args", lambda d: _w(d / "t10.json", trace([ev()]).replace('"shared memory": 1024',
                                                                              '"x": ' + _nested(3000))), 1, True),
        ("trace: AMD device", lambda d: _w(d / "t11.json", json.dumps({"traceEvents": [ev()], "deviceProperties": [
            {"id": 0, "name": "AMD Instinct MI250X", "computeMajor": 9, "computeMinor": 0}]})), 1, True),
        ("trace: gzipped", lambda d: _w(d / "t12.json.gz", gzip.compress(trace([ev(), ev(ts=20)]).encode())), 2, True),
        ("trace: 10^400 ts", lambda d: _w(d / "t13.json", trace([ev()]).replace('"ts": 10', '"ts": ' + "9" * 400)),
         1, True),
    ]


def _proton_cases() -> list[tuple[str, Callable[[Path], Path], int | None, bool]]:
    def node(name: str, children=None, **metrics) -> dict:
        return {"frame": {"name": name, "type": "function"}, "metrics": {"count": 1, "time (ns)": 1000, **metrics},
                "children": children or []}

    def hatchet(root) -> str:
        return json.dumps([root, {"device": {"CUDA": {"0": {"arch": "90", "num_sms": 132}}}}])

    return [
        ("proton: one leaf", lambda d: _w(d / "p1.hatchet", hatchet(node("ROOT", [node("k")]))), 1, True),
        ("proton: leaf without metrics", lambda d: _w(d / "p2.hatchet", json.dumps([{"frame": {"name": "ROOT"},
                                                                                       "children": [{"frame": {}}]}])),
         None, True),
        ("proton: time is a string", lambda d: _w(d / "p3.hatchet", hatchet(node("ROOT", [node("k", **{
            "time (ns)": "fast"})]))), 1, True),
        ("proton: 3000-deep tree", lambda d: _w(d / "p4.hatchet", "[" + _deep_tree(3000) + "]"), None, True),
        ("proton: children not a list", lambda d: _w(d / "p5.hatchet", json.dumps([{"frame": {"name": "ROOT"},
                                                                                      "children": 5}])), None, True),
        ("proton: flops and bytes", lambda d: _w(d / "p6.hatchet", hatchet(node("ROOT", [node(
            "k", flops=1e9, bytes=1e6)]))), 1, True),
        ("proton: 10^400 count", lambda d: _w(d / "p7.hatchet", hatchet(node("ROOT", [node("k")])).replace(
            '"count": 1', '"count": ' + "9" * 400, 1)), 1, True),
    ]


def _deep_tree(depth: int) -> str:
    """A Proton tree ``depth`` scopes deep, as text (json.dumps itself recurses too deep)."""
    leaf = json.dumps({"frame": {"name": "leaf"}, "metrics": {"time (ns)": 5, "count": 1}, "children": []})
    heads = "".join('{"frame": {"name": "n%d"}, "metrics": {}, "children": [' % i for i in reversed(range(depth)))
    return heads + leaf + "]}" * depth


def _ptxas_cases() -> list[tuple[str, Callable[[Path], Path], int | None, bool]]:
    good = ("ptxas info    : Compiling entry function 'gemm_kernel' for 'sm_90a'\n"
            "ptxas info    : Function properties for gemm_kernel\n"
            "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
            "ptxas info    : Used 128 registers, used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]\n")
    return [
        ("ptxas: one entry", lambda d: _w(d / "x1.log", good), 1, True),
        ("ptxas: empty entry name", lambda d: _w(d / "x2.log", good.replace("'gemm_kernel'", "''")
                                                 .replace("for gemm_kernel", "for ")), 1, True),
        ("ptxas: registers 9^400", lambda d: _w(d / "x3.log", good.replace("Used 128", "Used " + "9" * 400)), 1, True),
        ("ptxas: truncated after header", lambda d: _w(d / "x4.log", good.splitlines()[0] + "\n"), 1, True),
        ("ptxas: two entries, second garbled", lambda d: _w(d / "x5.log", good + good.replace("128 registers",
                                                                                               "many registers")),
         2, True),
        ("ptxas: non-UTF-8 bytes", lambda d: _w(d / "x6.log", good.encode() + b"\xff\xfe junk\n"), 1, True),
    ]


def _cache_cases() -> list[tuple[str, Callable[[Path], Path], int | None, bool]]:
    src = SAMPLES / "triton_cache"

    def copy_cache(d: Path, edit: Callable[[Path], None]) -> Path:
        dst = d / "cache"
        for f in src.rglob("*"):
            if f.is_file():
                _w(dst / f.relative_to(src), f.read_bytes())
        for sub in dst.iterdir():
            edit(sub)
            break
        return dst

    def drop_json(sub: Path) -> None:
        for f in sub.glob("*.json"):
            f.unlink()

    def json_dir(sub: Path) -> None:
        for f in sub.glob("*.json"):
            f.unlink()
            f.mkdir()

    def bad_json(sub: Path) -> None:
        for f in sub.glob("*.json"):
            f.write_text("{not json")

    def deep_json(sub: Path) -> None:
        for f in sub.glob("*.json"):
            f.write_text(_nested_obj(5000))

    return [
        ("triton cache: as committed", lambda d: copy_cache(d, lambda s: None), 2, True),
        ("triton cache: one .json missing", lambda d: copy_cache(d, drop_json), 2, True),
        ("triton cache: .json is a directory", lambda d: copy_cache(d, json_dir), 2, True),
        ("triton cache: .json garbled", lambda d: copy_cache(d, bad_json), 2, True),
        ("triton cache: .json 5000 deep", lambda d: copy_cache(d, deep_json), 2, True),
    ]


def _special_paths() -> list[tuple[str, Callable[[Path], Path], bool]]:
    """(name, builder, allow_success) for paths that are not regular files."""

    def fifo(d: Path) -> Path:
        p = d / "pipe.json"
        os.mkfifo(p)
        return p

    def loop(d: Path) -> Path:
        a, b = d / "loop_a.json", d / "loop_b.json"
        a.symlink_to(b)
        b.symlink_to(a)
        return a

    def dangling(d: Path) -> Path:
        p = d / "dangling.json"
        p.symlink_to(d / "nowhere.json")
        return p

    def dir_named_json(d: Path) -> Path:
        p = d / "dir.json"
        p.mkdir()
        return p

    return [
        ("FIFO", fifo, False),
        ("symlink loop", loop, False),
        ("dangling symlink", dangling, False),
        ("directory named .json", dir_named_json, True),
        ("/dev/null", lambda d: Path("/dev/null"), False),
        ("/dev/zero (endless)", lambda d: Path("/dev/zero"), False),
        ("missing file", lambda d: d / "missing.json", False),
        ("name with newline", lambda d: _w(d / "a\nb.json", json.dumps([SEED_ITEM])), True),
    ]


# ---------------------------------------------------------------------------------------------
# The cases, by entry point
# ---------------------------------------------------------------------------------------------
def _review_store(d: Path, content: bytes | str | None = None, trail: bytes | str | None = None) -> Path:
    data = d / "data"
    data.mkdir(parents=True, exist_ok=True)
    if content is not None:
        _w(data / "recommendations.json", content)
    if trail is not None:
        _w(data / "review_trail.jsonl", trail)
    return data


def cases() -> list[Case]:
    out: list[Case] = []
    file_sets = [*_file_cases(), *_runner_cases(), *_ncu_cases(), *_trace_cases(), *_proton_cases(),
                 *_ptxas_cases(), *_cache_cases()]
    for name, build, n, ok in file_sets:
        out.append(Case(f"ingest / {name}", "ingest", lambda d, b=build: _ingest(d, b(d)), n, ok))
    for name, build, n, ok in _file_cases():
        # assess takes seed-format items only: non-seed content must be refused or quarantined
        out.append(Case(f"assess / {name}", "assess", lambda d, b=build: ["assess", str(b(d))], None, ok))
    for name, build, ok in _special_paths():
        out.append(Case(f"ingest / {name}", "ingest", lambda d, b=build: _ingest(d, b(d)), None, ok))
        out.append(Case(f"assess / {name}", "assess", lambda d, b=build: ["assess", str(b(d))], None, ok))

    def multi(d: Path) -> list[str]:
        good = _w(d / "good.jsonl", _jsonl([_runner_row(), _runner_row(config_id="x")]))
        return ["ingest", str(good), str(d / "missing.json"), str(_w(d / "bin.json", b"\xff" * 999)),
                "--out", str(d / "out")]
    out.append(Case("ingest / one good file, two unreadable", "ingest", multi, 2, True))
    out.append(Case("ingest / --out is a file", "ingest",
                    lambda d: ["ingest", str(_w(d / "r.jsonl", _jsonl([_runner_row()]))), "--out",
                               str(_w(d / "outfile", "x"))], None, False))
    out.append(Case("ingest / no paths", "ingest", lambda d: ["ingest", "--out", str(d / "out")], None, False))

    # review and export: the store and the trail are inputs too
    rev = [
        ("no store yet", lambda d: _review_store(d)),
        ("store is binary", lambda d: _review_store(d, bytes(range(256)))),
        ("store is latin-1", lambda d: _review_store(d, '{"x": "caf\xe9"}'.encode("latin-1"))),
        ("store is 3000 deep", lambda d: _review_store(d, _nested_obj(3000))),
        ("store is a list", lambda d: _review_store(d, "[1, 2]")),
        ("store is a directory", lambda d: (_review_store(d), (d / "data" / "recommendations.json").mkdir())[0]),
        ("trail is binary", lambda d: _review_store(d, None, bytes(range(256)))),
        ("trail line truncated", lambda d: _review_store(d, None, '{"rec_id": "rec-1", "decision": "APP')),
        ("trail is 3000 deep", lambda d: _review_store(d, None, _nested(3000) + "\n")),
    ]
    for name, build in rev:
        out.append(Case(f"review list / {name}", "review",
                        lambda d, b=build: ["review", "list", "--data-dir", str(b(d))], None, True))
        out.append(Case(f"review approve / {name}", "review",
                        lambda d, b=build: ["review", "approve", "rec-0123456789ab", "--reviewer", "qa",
                                            "--comment", "ok", "--data-dir", str(b(d))], None, False))
        out.append(Case(f"review verify / {name}", "review",
                        lambda d, b=build: ["review", "verify", "--data-dir", str(b(d))], None, True))
        out.append(Case(f"export / {name}", "export",
                        lambda d, b=build: ["export", "--data-dir", str(b(d)), "--out", str(d / "exp")], None, True))
    out.append(Case("export / --out is a file", "export",
                    lambda d: ["export", "--data-dir", str(_review_store(d)), "--out", str(_w(d / "f", "x"))],
                    None, True))
    out.append(Case("export / unknown recommendation id", "export",
                    lambda d: ["export", "rec-ffffffffffff", "--data-dir", str(_review_store(d)), "--out",
                               str(d / "exp")], None, False))

    hist = [
        ("history list, empty data folder", lambda d: ["history", "list", "--data-dir", str(d / "data")], True),
        ("history accept unknown run", lambda d: ["history", "accept", "no-such-run", "--data-dir",
                                                  str(d / "data")], False),
        ("history list, DB is garbage", lambda d: ["history", "list", "--data-dir",
                                                   str(_w(d / "data" / "history.duckdb", b"\x00garbage" * 100).parent)],
         False),
        ("history list, DB is a directory", lambda d: ["history", "list", "--data-dir",
                                                       str((d / "data" / "history.duckdb").mkdir(parents=True) or
                                                           d / "data")], False),
        ("history compare, empty", lambda d: ["history", "compare", "--data-dir", str(d / "data")], True),
    ]
    for name, build, ok in hist:
        out.append(Case(f"history / {name}", "history", build, None, ok))

    def kernel_module(stem: str, body: str) -> Callable[[Path], list[str]]:
        def build(d: Path) -> list[str]:
            return ["static", str(_w(d / f"{stem}.py", body)), "--timeout-s", "20"]
        return build

    contract = ("import triton\nimport triton.language as tl\nNAME = 'k'\nDTYPE = 'fp16'\n"
                "BASELINE_NAME = 'x'\n@triton.jit\ndef KERNEL(x_ptr, BLOCK: tl.constexpr):\n"
                "    tl.store(x_ptr + tl.arange(0, BLOCK), tl.zeros((BLOCK,), tl.float16))\n"
                "CONFIGS = [{'BLOCK': 64, 'num_warps': 4, 'num_stages': 2}]\n"
                "from kernaudit_pipeline.kernel_spec import Ptr, Shape\nSHAPES = [Shape('s', {'M': 64})]\n"
                "def grid(shape, config):\n    return (1,)\n")
    statics = [
        ("unknown kernel name", lambda d: ["static", "no_such_kernel"], False),
        ("kernel path is a directory", lambda d: ["static", str((d / "kdir.py").mkdir() or d / "kdir.py")], False),
        ("kernel module: syntax error", kernel_module("k_syntax", "def (:\n"), False),
        ("kernel module: raises at import", kernel_module("k_raises", "raise RuntimeError('boom at import')\n"), False),
        ("kernel module: hangs at import",
         kernel_module("k_hangs", "import time\nwhile True:\n    time.sleep(1)\n"), False),
        ("kernel module: no KERNEL", kernel_module("k_empty", "NAME = 'x'\nCONFIGS = []\nSHAPES = []\n"), False),
        ("kernel module: compile_args raises", kernel_module(
            "k_args_raise", contract + "def compile_args(shape, config):\n    raise ValueError('bad args')\n"), True),
        ("kernel module: compile_args hangs", kernel_module(
            "k_args_hang", contract + "def compile_args(shape, config):\n    import time\n    time.sleep(3600)\n"),
         True),
        ("kernel module: binary", lambda d: ["static", str(_w(d / "k_bin.py", bytes(range(256))))], False),
        ("static: --arch nonsense", lambda d: ["static", "gemm", "--arch", "sm_1"], False),
        ("static: --timeout-s negative", lambda d: ["static", "gemm", "--timeout-s", "-1"], False),
    ]
    for name, build, ok in statics:
        out.append(Case(f"static / {name}", "static", build, None, ok))
        if name.startswith("kernel module") or name.startswith("unknown"):
            out.append(Case(f"rank / {name}", "rank",
                            lambda d, b=build: ["rank", *b(d)[1:], "--json"], None, ok))
    out.append(Case("assess / seed file is fine (control)", "assess",
                    lambda d: ["assess", str(REPO / "examples" / "seed_starter.json"), "--brief"], None, True))
    out.append(Case("bench / no GPU here", "bench", lambda d: ["bench", "gemm", "--out", str(d / "b.jsonl")],
                    None, False))

    audits = [
        ("binary file", lambda d: _w(d / "bin.json", bytes(range(256)) * 10), False),
        ("3000-deep JSON", lambda d: _w(d / "deep.json", _nested(3000)), False),
        ("foreign runner rows only", lambda d: _w(d / "foreign.jsonl", _jsonl([
            _runner_row(kernel_name="my_softmax", config_id="BN1024_w4", block_m=None, block_k=None,
                        group_m=None, m=None, n=None, k=None)])), True),
        ("FIFO", lambda d: (os.mkfifo(d / "p.json"), d / "p.json")[1], False),
    ]
    for name, build, ok in audits:
        out.append(Case(f"audit --source / {name}", "audit",
                        lambda d, b=build: ["audit", "--source", str(b(d)), "--no-static", "--no-synthetic", "--no-gpu",
                                            "--quiet", "--data-dir", str(d / "data")], None, ok, slow=True))
    return out
