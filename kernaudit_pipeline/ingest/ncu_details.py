"""Nsight Compute ``--csv --page details``: one row per metric, plus rule rows.

Columns (ncu 2025.3): ``ID, Process ID, Process Name, Host Name, Kernel Name,
Context, Stream, Block Size, Grid Size, Device, CC, Section Name, Metric Name,
Metric Unit, Metric Value, Rule Name, Rule Type, Rule Description, Estimated
Speedup Type, Estimated Speedup``. Metric rows name metrics by their display
names ("Duration", "Registers Per Thread", "Block Limit Shared Mem"); rule rows
leave the metric columns empty. The ``Device`` column is the device index:
this page carries no device name, only the compute capability.

Each launch (``ID``) becomes one kernel_runs row; its rule rows go to the
rules table that the report shows. Metrics requested by name (``--metrics``)
appear in a "Command line profiler metrics" section under their raw names;
they are read exactly as on the raw page and win over the rounded display
values ("147.46" Kbyte/block). The details page has no per-reason stall
metrics: the lg_throttle and long_scoreboard shares are read from the
WarpStateStats rule that ncu writes for the dominant stall reasons ("This
stall type represents about 40.5% of the total average of 19.6 cycles"), so
they are present only for the reasons ncu flagged, and never invented as 0.
"""

from __future__ import annotations

import re
from pathlib import Path

from kernaudit_pipeline.ingest._common import IngestError, Parsed, bad, kernel_fields, warps_from_threads
from kernaudit_pipeline.ingest.ncu_raw import (
    find_header, fixed_columns, launch_row, read_csv,
)
from kernaudit_pipeline.ingest.units import (
    BadValue, as_int, bytes_from, freq_to_mhz, parse_number, time_to_us,
)

FORMAT = "ncu_details"
REQUIRED = ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value")
RULE_COLUMNS = ("Rule Name", "Rule Type", "Rule Description", "Estimated Speedup Type", "Estimated Speedup")

# Display name -> (kind, column). Kinds: time, bytes, freq, int, pct, plain. The names of
# ncu 2019-2021 are mapped too: "SM [%]" and "Memory [%]" (later "Compute (SM) Throughput"
# and "Memory Throughput"), "SOL SM" (2019.x).
METRICS: dict[str, tuple[str, str]] = {
    "Duration": ("time", "latency_us"),
    "Compute (SM) Throughput": ("pct", "sm_throughput_pct"),
    "SM [%]": ("pct", "sm_throughput_pct"),
    "SOL SM": ("pct", "sm_throughput_pct"),
    "Memory Throughput": ("pct", "memory_throughput_pct"),  # the SOL one is "%"; MWA's is Gbyte/s
    "Memory [%]": ("pct", "memory_throughput_pct"),
    "SM Frequency": ("freq", "sm_clock_mhz"),
    "Registers Per Thread": ("int", "registers_per_thread"),
    "Static Shared Memory Per Block": ("bytes", "shared_mem_static_bytes"),
    "Dynamic Shared Memory Per Block": ("bytes", "shared_mem_dynamic_bytes"),
    "Driver Shared Memory Per Block": ("bytes", "ncu_shared_mem_driver_bytes"),
    "Shared Memory Configuration Size": ("bytes", "ncu_shared_mem_config_bytes"),
    "Block Size": ("int", "threads_per_block"),
    "Grid Size": ("int", "grid_size"),
    "# SMs": ("plain", "ncu_sm_count"),
    "Waves Per SM": ("plain", "ncu_waves_per_sm"),
    "Block Limit Registers": ("int", "ncu_occupancy_limit_registers"),
    "Block Limit Shared Mem": ("int", "ncu_occupancy_limit_shared_mem"),
    "Block Limit Warps": ("int", "ncu_occupancy_limit_warps"),
    "Block Limit SM": ("int", "ncu_occupancy_limit_blocks"),
    "Theoretical Occupancy": ("pct", "ncu_theoretical_occupancy_pct"),
    "Achieved Occupancy": ("pct", "achieved_occupancy_pct"),
    "Local Memory Spilling Requests": ("plain", "local_spill_requests"),
    "Warp Cycles Per Issued Instruction": ("plain", "ncu_warp_cycles_per_issued_inst"),
}
INT_BYTES = {"shared_mem_static_bytes", "shared_mem_dynamic_bytes"}

# The WarpStateStats (CPIStall) rule's wording for the two stall reasons of the spill chain.
STALL_PHRASES = {
    "stall_lg_throttle_pct": "local and global (LG) memory operations",
    "stall_long_scoreboard_pct": "scoreboard dependency on a L1TEX",
}
STALL_SHARE_RE = re.compile(r"represents about ([0-9.]+)% of the total")
OCC_LIMIT_RE = re.compile(r"theoretical occupancy \(([0-9.]+)%\) is limited by (.+?)\.\s*$")
OCC_PHRASES = {"registers": "registers", "shared_mem": "shared memory", "warps": "warps",
               "blocks": "blocks"}


SMEM_GRANULE_BYTES = 128


def snap_rounded_bytes(text: str, unit: str, nbytes: float | None, granule: int = SMEM_GRANULE_BYTES) -> float | None:
    """Undo the details page's rounding of shared memory when the digits allow only one aligned value.

    The page prints ``147.46`` Kbyte/block for 147,456 bytes: the true value lies within half a
    unit of the last printed digit (+-5 bytes here). When exactly one multiple of the 128-byte
    allocation granule lies in that interval, it is the value (allocations are granule-aligned
    in every kernel seen); otherwise the printed value stands. Without this, 232.45 Kbyte reads
    as 232,450 bytes, one granule past the opt-in limit, and occupancy would read 0.
    """
    if nbytes is None or not text:
        return nbytes
    digits = text.replace(",", "").strip()
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    scale = bytes_from(1.0, unit) or 1.0
    half = 0.5 * scale * 10.0 ** (-decimals)
    if half < 1:
        return nbytes
    low, high = nbytes - half, nbytes + half
    first = -(-int(low) // granule) * granule
    candidates = [x for x in range(first, int(high) + 1, granule) if low <= x < high]
    return float(candidates[0]) if len(candidates) == 1 else nbytes


def _convert(kind: str, value: float | None, unit: str) -> float | None:
    if kind == "time":
        return time_to_us(value, unit)
    if kind == "bytes":
        return bytes_from(value, unit)
    if kind == "freq":
        return freq_to_mhz(value, unit)
    return value


def rule_record(cells: dict[str, str], prov: dict, launch_id: int | None) -> dict:
    try:
        speedup = parse_number(cells.get("Estimated Speedup"))
    except BadValue:
        speedup = None
    names = kernel_fields(cells.get("Kernel Name", ""))
    return {
        "kernel_name": names["kernel_name"],
        "profiler_kernel_name": names["profiler_kernel_name"],
        "launch_id": launch_id,
        "section": cells.get("Section Name") or None,
        "rule_name": cells.get("Rule Name") or None,
        "rule_type": cells.get("Rule Type") or None,
        "description": cells.get("Rule Description") or None,
        "estimated_speedup_type": cells.get("Estimated Speedup Type") or None,
        "estimated_speedup_pct": speedup,
        **prov,
    }


def _stall_shares_from_rules(rules: list[dict]) -> dict[str, float]:
    out: dict[str, float] = {}
    for rule in rules:
        text = rule.get("description") or ""
        match = STALL_SHARE_RE.search(text)
        if not match:
            continue
        for column, phrase in STALL_PHRASES.items():
            if phrase in text:
                out[column] = float(match.group(1))
    return out


def occupancy_limiters_from_rules(rules: list[dict]) -> tuple[str, ...] | None:
    """The limiters ncu's TheoreticalOccupancy rule names, in its order."""
    for rule in rules:
        if rule.get("rule_name") != "TheoreticalOccupancy":
            continue
        match = OCC_LIMIT_RE.search((rule.get("description") or "").strip())
        if match:
            text = match.group(2)
            return tuple(name for name, phrase in OCC_PHRASES.items() if phrase in text)
    return None


def _metric_value(name: str, unit: str, value: str, line: int) -> tuple[str, float | int | None] | None:
    """(column, value) of one metric line, None for metrics no column holds."""
    spec = METRICS.get(name)
    if spec is None:
        return None
    kind, column = spec
    if kind == "pct" and unit.strip() not in ("%", ""):
        return None  # e.g. the Memory Workload Analysis "Memory Throughput" in Gbyte/s
    try:
        number = _convert(kind, parse_number(value), unit)
        if column in INT_BYTES:
            number = snap_rounded_bytes(value, unit, number)
    except BadValue as exc:
        raise BadValue(f"{name} (line {line}): {exc}") from None
    if kind == "int" or column in INT_BYTES:
        number = as_int(number)
    return column, number


def parse(path: Path, source_file: str) -> Parsed:
    table, line_of = read_csv(path)
    h = find_header(table)
    header = [c.strip() for c in table[h]]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise IngestError(f"Nsight Compute details page without columns {missing}")
    min_fields = header.index("Metric Value") + 1
    launches: dict[int, dict] = {}  # launch id -> state
    order: list[int] = []
    quarantine: list[dict] = []
    rules: list[dict] = []
    garbled = 0
    for i, (cells, line) in enumerate(zip(table[h + 1:], line_of[h + 1:])):
        if not cells or not any(c.strip() for c in cells):
            continue
        prov = {"source_format": FORMAT, "source_file": source_file, "source_row": i}
        # ncu ends a metric line after "Metric Value" (16 of 20 fields): the rule columns it
        # leaves off are empty. Fewer fields than that, or more than the header, is garbled.
        if not (min_fields <= len(cells) <= len(header)):
            garbled += 1
            quarantine.append(bad({**prov, "raw_line": ",".join(cells)[:500]},
                                  f"line {line}: garbled line: {len(cells)} fields, header has {len(header)}"))
            continue
        cells = cells + [""] * (len(header) - len(cells))
        record = {k: v.strip() for k, v in zip(header, cells)}
        try:
            launch_id = as_int(parse_number(record.get("ID")))
        except BadValue:
            launch_id = None
        if launch_id is None or not record.get("Kernel Name"):
            garbled += 1
            quarantine.append(bad({**prov, "raw_line": ",".join(cells)[:500]},
                                  f"line {line}: line without launch ID or Kernel Name"))
            continue
        state = launches.get(launch_id)
        if state is None:
            state = launches[launch_id] = {"first_row": i, "record": record, "metrics": [], "rules": []}
            order.append(launch_id)
        if record.get("Rule Name"):
            rule = rule_record(record, prov, launch_id)
            state["rules"].append(rule)
            rules.append(rule)
        if record.get("Metric Name"):
            state["metrics"].append((record["Metric Name"], record.get("Metric Unit", ""),
                                     record.get("Metric Value", ""), line))

    rows: list[dict] = []
    fixed_names = fixed_columns(header)
    for launch_id in order:
        state = launches[launch_id]
        first = state["record"]
        prov = {"source_format": FORMAT, "source_file": source_file, "source_row": state["first_row"]}
        fixed = {c: first.get(c, "") for c in fixed_names}
        try:
            row = _launch(state, fixed, launch_id)
        except BadValue as exc:
            quarantine.append(bad({**kernel_fields(first["Kernel Name"]), "ncu_launch_id": launch_id, **prov},
                                  str(exc)))
            continue
        rows.append({**row, **prov})
    return Parsed(rows=rows, quarantine=quarantine, records_in=len(order) + garbled, rules=rules,
                  note=f"{len(rules)} rule messages")


def _launch(state: dict, fixed: dict[str, str], launch_id: int) -> dict:
    """One launch's row; raises :class:`BadValue` for a value that cannot be read, or a
    metric printed twice with different values (neither copy is silently preferred)."""
    seen: dict[tuple[str, str], tuple[str, int]] = {}
    for name, unit, value, line in state["metrics"]:
        key = (name, unit)
        if key in seen and seen[key][0] != value:
            raise BadValue(f"{name} ({unit or 'no unit'}) appears twice with different values "
                           f"({seen[key][0]!r} at line {seen[key][1]}, {value!r} at line {line})")
        seen.setdefault(key, (value, line))
    # Metrics asked for by name (``--metrics``) appear under their raw names in the
    # "Command line profiler metrics" section: read them exactly as the raw page is read.
    raw_metrics = {name: value for name, _, value, _ in state["metrics"] if "__" in name}
    raw_units = {name: unit for name, unit, _, _ in state["metrics"] if "__" in name}
    row = launch_row(raw_metrics, raw_units, fixed)
    row["ncu_launch_id"] = launch_id
    for name, unit, value, line in state["metrics"]:
        got = _metric_value(name, unit, value, line)
        if got is None:
            continue
        column, number = got
        if row.get(column) is None:  # the raw metric, when present, has more digits
            row[column] = number
    for column, share in _stall_shares_from_rules(state["rules"]).items():
        if row.get(column) is None:
            row[column] = share
    limiters = occupancy_limiters_from_rules(state["rules"])
    if limiters is not None:
        row["ncu_rule_occupancy_limiters"] = ",".join(limiters)
    st, dy = row.get("shared_mem_static_bytes"), row.get("shared_mem_dynamic_bytes")
    if st is not None and dy is not None:
        row["shared_mem_bytes"] = st + dy
    warps_from_threads(row)
    return row
