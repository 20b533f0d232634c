"""Which GPUs this host has, and how the GPU work is split between them.

The Dagster layer builds one runner step per device, each in its own pool
(limit 1, from ``dagster.yaml``), so that two steps never share a GPU and
every device stays busy. This module only answers the questions that split
needs, without importing torch (the code location must load fast):

- the device listing: ``KERNAUDIT_GPU_HOSTS`` (``hosta=0,1;hostb=0``, for
  several GPU hosts behind one Dagster: docs/scaling.md) when set, else
  ``KERNAUDIT_GPU_DEVICES`` (``0,1,2``; ``none`` for no GPU), else
  ``CUDA_VISIBLE_DEVICES`` when set (:func:`declared_devices`: the environment
  only, read when the code location loads), else ``nvidia-smi --query-gpu``,
  asked when a run starts, never at load (:func:`list_devices`); no nvidia-smi
  means no GPU;
- the pool of a device: ``gpu`` on a host with at most one GPU (the pool the
  project's docs and ``dagster.yaml`` speak of), ``gpu-<index>`` on a host
  with several, ``gpu-<host>-<index>`` across hosts;
- a static, stable kernel-to-device assignment (round-robin over the sorted
  list of every kernel module, so a kernel always lands on the same device,
  whatever subset a run audits);
- the environment of a pinned process: ``CUDA_VISIBLE_DEVICES`` = that device.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

DEVICES_ENV = "KERNAUDIT_GPU_DEVICES"
HOSTS_ENV = "KERNAUDIT_GPU_HOSTS"
GPU_POOL = "gpu"
NO_DEVICE_WORDS = frozenset({"", "none", "-1", "no"})


class DeviceListingError(ValueError):
    """A device listing that cannot be right (duplicates, bad characters)."""


@dataclass(frozen=True)
class GpuDevice:
    """One CUDA device as CUDA_VISIBLE_DEVICES names it (an index or a GPU-UUID)."""

    visible_id: str
    name: str | None = None
    uuid: str | None = None
    host: str | None = None  # set when one Dagster deployment drives several GPU hosts

    @property
    def slug(self) -> str:
        """A name usable in Dagster op names and pools (letters, digits, underscores)."""
        text = f"{self.host}_{self.visible_id}" if self.host else self.visible_id
        return "".join(ch if ch.isalnum() else "_" for ch in text)


@dataclass(frozen=True)
class DeviceRun:
    """What one device's runner step did: its trace file, or why it did not run."""

    visible_id: str
    kernels: tuple[str, ...]
    trace_file: str | None
    note: str


def _parse_ids(text: str, source: str) -> list[GpuDevice]:
    ids = [part.strip() for part in text.split(",")]
    if text.strip().lower() in NO_DEVICE_WORDS:
        return []
    if any(not i for i in ids):
        raise DeviceListingError(f"{source}={text!r}: empty device id")
    bad = [i for i in ids if not all(ch.isalnum() or ch in "-_:" for ch in i)]
    if bad:
        raise DeviceListingError(f"{source}={text!r}: not a device id: {bad[0]!r}")
    if len(set(ids)) != len(ids):
        raise DeviceListingError(f"{source}={text!r}: a device is listed twice")
    return [GpuDevice(visible_id=i) for i in ids]


def parse_hosts(text: str) -> list[GpuDevice]:
    """``hosta=0,1;hostb=0``: the devices of each GPU host, in order."""
    devices: list[GpuDevice] = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        host, sep, ids = part.partition("=")
        host = host.strip()
        if not sep or not host or not all(ch.isalnum() or ch in "-." for ch in host):
            raise DeviceListingError(f"{HOSTS_ENV}={text!r}: expected HOST=ID[,ID...] entries separated by ';'")
        if any(d.host == host for d in devices):
            raise DeviceListingError(f"{HOSTS_ENV}={text!r}: host {host!r} is listed twice")
        devices += [GpuDevice(visible_id=d.visible_id, host=host) for d in _parse_ids(ids, HOSTS_ENV)]
    return devices


def parse_nvidia_smi_csv(text: str) -> list[GpuDevice]:
    """``nvidia-smi --query-gpu=index,name,uuid --format=csv,noheader`` output."""
    devices = []
    for row in csv.reader(io.StringIO(text)):
        if len(row) < 3:
            continue
        index, name, uuid = (field.strip() for field in row[:3])
        if index.isdigit():
            devices.append(GpuDevice(visible_id=index, name=name or None, uuid=uuid or None))
    return devices


def query_nvidia_smi(timeout_s: float = 10.0) -> list[GpuDevice]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        proc = subprocess.run([exe, "--query-gpu=index,name,uuid", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_nvidia_smi_csv(proc.stdout) if proc.returncode == 0 else []


def declared_devices(environ: dict[str, str] | None = None) -> list[GpuDevice] | None:
    """The devices the environment names, or None when it names none (then ask at run time).

    Reads only environment variables: the code location calls this at load, where no
    subprocess may run.
    """
    env = os.environ if environ is None else environ
    if env.get(HOSTS_ENV, "").strip():
        return parse_hosts(env[HOSTS_ENV])
    if DEVICES_ENV in env:
        return _parse_ids(env[DEVICES_ENV], DEVICES_ENV)
    if env.get("CUDA_VISIBLE_DEVICES") is not None:
        return _parse_ids(env["CUDA_VISIBLE_DEVICES"], "CUDA_VISIBLE_DEVICES")
    return None


def list_devices(environ: dict[str, str] | None = None) -> list[GpuDevice]:
    """The devices GPU steps may use, in order: the declared ones, else nvidia-smi's (run time only)."""
    declared = declared_devices(environ)
    return query_nvidia_smi() if declared is None else declared


def torch_sees_cuda() -> bool:
    """Whether this process's torch can use a CUDA device (False without torch)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pool_for(device: GpuDevice | None, device_count: int) -> str:
    """``gpu`` with at most one device, ``gpu-<id>`` with several, ``gpu-<host>-<id>`` across hosts.

    Every pool has one slot (``dagster.yaml``'s ``default_limit``).
    """
    if device is None or (device_count <= 1 and device.host is None):
        return GPU_POOL
    if device.host:
        return f"{GPU_POOL}-{device.host}-{device.visible_id}"
    return f"{GPU_POOL}-{device.slug}"


def assign_kernels(all_kernels: list[str], devices: list[GpuDevice],
                   wanted: list[str] | None = None) -> dict[str, list[str]]:
    """Static kernel -> device split: round-robin over the sorted full kernel list.

    Returns ``{slug: [kernel, ...]}`` for every device (possibly empty),
    restricted to ``wanted`` when given.
    """
    ordered = sorted(all_kernels)
    share: dict[str, list[str]] = {d.slug: [] for d in devices}
    if not devices:
        return share
    chosen = set(wanted) if wanted else set(ordered)
    for position, kernel in enumerate(ordered):
        if kernel in chosen:
            share[devices[position % len(devices)].slug].append(kernel)
    return share


def pinned_env(device: GpuDevice, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a process that must see exactly this one device."""
    env = dict(os.environ if base is None else base)
    env["CUDA_VISIBLE_DEVICES"] = device.visible_id
    env.pop(DEVICES_ENV, None)  # the child sees one device; it must not re-split
    env.pop(HOSTS_ENV, None)
    return env


def runner_command(out: Path, kernels: list[str], extra_args: list[str] | None = None) -> list[str]:
    return [sys.executable, "-m", "kernaudit_pipeline.bench.runner", "--out", str(out), *(extra_args or []), *kernels]


def run_on_device(device: GpuDevice, traces_dir: Path, kernels: list[str], *, cwd: Path,
                  timeout_s: int = 3600, extra_args: list[str] | None = None) -> Path:
    """Run the GPU runner for ``kernels`` pinned to ``device``; returns its JSONL.

    The runner isolates each kernel in a worker subprocess of its own; this
    process only pins the device and waits (bounded by ``timeout_s``).
    """
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    out = traces_dir / f"bench-gpu{device.slug}-{stamp}.jsonl"
    subprocess.run(runner_command(out, kernels, extra_args), check=True, timeout=timeout_s, cwd=cwd,
                   env=pinned_env(device))
    return out


def run_on_devices(work: list[tuple[GpuDevice, list[str]]], traces_dir: Path, *, cwd: Path,
                   timeout_s: int = 3600) -> list[DeviceRun]:
    """Each (device, kernels) pair's runner, side by side (one pinned process per device).

    A runner that fails or runs past ``timeout_s`` raises once every device is done: the
    step fails with that reason rather than auditing stale samples as if they were this run.
    """
    def one(device: GpuDevice, kernels: list[str]) -> DeviceRun:
        out = run_on_device(device, traces_dir, kernels, cwd=cwd, timeout_s=timeout_s)
        return DeviceRun(visible_id=device.visible_id, kernels=tuple(kernels), trace_file=str(out),
                         note=f"timed on CUDA_VISIBLE_DEVICES={device.visible_id}")

    if not work:
        return []
    with ThreadPoolExecutor(max_workers=len(work)) as pool:
        return list(pool.map(lambda pair: one(*pair), work))


def cli(argv: list[str]) -> int:
    """``python -m kernaudit_pipeline.gpu_devices``: print the listing and the pools."""
    try:
        devices = list_devices()
    except DeviceListingError as exc:
        print(f"gpu_devices: {exc}", file=sys.stderr)
        return 2
    if not devices:
        print(f"no GPU listed: the traces step runs in pool {GPU_POOL!r} on the committed samples")
    for device in devices:
        print(f"{device.host or 'local'}\t{device.visible_id}\t{device.name or '-'}\t{device.uuid or '-'}\t"
              f"pool={pool_for(device, len(devices))}")
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
