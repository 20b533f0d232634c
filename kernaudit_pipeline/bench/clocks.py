"""The clock and throttle guard: samples taken while the SM clock sagged are not trusted.

nvbench's practice (ANCHORS.md): discard samples taken while the SM clock is below 75 % of its
maximum. The runner reads the SM clock and the clocks-event (throttle) reasons through NVML
(``pynvml`` from nvidia-ml-py, an optional import) before and after every block of pairs; a
block whose lower reading is under ``fraction * max clock`` is discarded and counted. The
clocks are only read, never set. Without NVML the guard is off and the rows say so.

Standard library only (``pynvml`` imported inside :meth:`ClockReader.open`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median

from kernaudit_pipeline.bench.records import ClockStats

DEFAULT_FRACTION = 0.75

# NVML clocks-event (throttle) reason bits, nvml.h (nvmlClocksEventReason*).
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
    0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}


def reason_names(mask: int | None) -> tuple[str, ...]:
    if not mask:
        return ()
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    unknown = mask & ~sum(THROTTLE_REASONS)
    if unknown:
        names.append(f"0x{unknown:x}")
    return tuple(names)


@dataclass(frozen=True)
class ClockSample:
    sm_mhz: float
    reasons: int = 0


@dataclass(frozen=True)
class ClockGuard:
    """Keep a block only if the SM clock stayed at or above ``fraction`` of ``max_mhz``."""

    max_mhz: float | None
    fraction: float = DEFAULT_FRACTION

    @property
    def threshold_mhz(self) -> float | None:
        return None if not self.max_mhz else self.fraction * self.max_mhz

    def keep(self, readings: Sequence[ClockSample | None]) -> bool:
        seen = [r.sm_mhz for r in readings if r is not None]
        if self.threshold_mhz is None or not seen:
            return True
        return min(seen) >= self.threshold_mhz


@dataclass(frozen=True)
class BlockClocks:
    """The readings around one block, whether it was kept, and how many samples it held."""

    readings: tuple[ClockSample | None, ...]
    kept: bool
    samples: int


def clock_stats(blocks: Sequence[BlockClocks], guard: ClockGuard, note: str | None = None) -> ClockStats:
    """What the rows record: the clocks seen, the threshold, the samples discarded."""
    mhz = [r.sm_mhz for b in blocks for r in b.readings if r is not None]
    mask = 0
    for b in blocks:
        for r in b.readings:
            if r is not None:
                mask |= r.reasons
    # idle is what a GPU reports between launches; it is not a throttle of the timed work
    reasons = tuple(n for n in reason_names(mask) if n != "gpu_idle")
    return ClockStats(
        median_mhz=float(median(mhz)) if mhz else None, min_mhz=min(mhz) if mhz else None,
        max_mhz=max(mhz) if mhz else None, threshold_mhz=guard.threshold_mhz,
        discarded_samples=sum(b.samples for b in blocks if not b.kept),
        throttle_reasons=reasons,
        note=note if note is not None else (None if guard.threshold_mhz is not None
                                            else "clock guard off: NVML not available"))


class ClockReader:
    """SM clock and throttle reasons of one GPU through NVML; ``read`` never raises."""

    def __init__(self, nvml, handle, max_mhz: float | None):
        self._nvml = nvml
        self._handle = handle
        self.max_mhz = max_mhz

    @classmethod
    def open(cls, uuid: str | None = None, index: int = 0) -> ClockReader | None:
        """The reader for the GPU with this UUID (torch's ``props.uuid``), else ``index``;
        None when pynvml or NVML is not there."""
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
            handle = None
            if uuid:
                text = uuid if str(uuid).startswith("GPU-") else f"GPU-{uuid}"
                try:
                    handle = pynvml.nvmlDeviceGetHandleByUUID(text)
                except pynvml.NVMLError:
                    handle = None
            if handle is None:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            max_mhz = float(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM))
        except Exception:  # NVML missing or refusing: the guard is off, the rows say so
            return None
        return cls(pynvml, handle, max_mhz or None)

    def read(self) -> ClockSample | None:
        nvml = self._nvml
        try:
            mhz = float(nvml.nvmlDeviceGetClockInfo(self._handle, nvml.NVML_CLOCK_SM))
        except Exception:
            return None
        reasons = 0
        for getter in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(nvml, getter, None)
            if fn is None:
                continue
            try:
                reasons = int(fn(self._handle))
                break
            except Exception:
                continue
        return ClockSample(sm_mhz=mhz, reasons=reasons)
