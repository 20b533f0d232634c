"""Write a smaller copy of the flashinfer-python wheel for a GPU host that has no network.

The upstream wheel (62 MB for 0.7.2.post1) ships the CUDA sources of every FlashInfer operator
for run-time (JIT) compilation. The paged decode reference JIT-compiles only
``batch_decode*.cu`` from ``data/csrc`` with the headers under ``data/include``, CUTLASS's
``include`` and ``tools/util/include``, spdlog and CCCL (``flashinfer/jit/env.py`` lists those
include folders). This keeps every Python module (``import flashinfer`` imports nearly all of
them) and those headers, drops the other operators' sources and CUTLASS/CCCL's examples,
documentation and Python packages, and rewrites ``RECORD`` to list exactly what is kept, so
``pip install --no-deps`` installs it as usual.

    python scripts/slim_flashinfer_wheel.py IN.whl OUT_DIR
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

KEEP_DATA_PREFIXES = (
    "flashinfer/data/include/",
    "flashinfer/data/spdlog/include/",
    "flashinfer/data/cutlass/include/",
    "flashinfer/data/cutlass/tools/util/include/",
    "flashinfer/data/cccl/cub/cub/",
    "flashinfer/data/cccl/libcudacxx/include/",
    "flashinfer/data/cccl/thrust/thrust/",
)


def keep(name: str) -> bool:
    if not name.startswith("flashinfer/data/"):
        return True  # Python modules and the dist-info
    if name.startswith("flashinfer/data/csrc/"):
        return "/" not in name[len("flashinfer/data/csrc/"):]  # top-level sources only
    return name.startswith(KEEP_DATA_PREFIXES)


def slim(src: Path, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    dest = out_dir / src.name
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        names = [i.filename for i in zin.infolist() if keep(i.filename)]
        record_name = next(n for n in names if n.endswith(".dist-info/RECORD"))
        kept = set(names)
        for name in names:
            if name == record_name:
                continue
            zout.writestr(zin.getinfo(name), zin.read(name))
        lines = [ln for ln in zin.read(record_name).decode().splitlines()
                 if ln and ln.split(",", 1)[0] in kept and ln.split(",", 1)[0] != record_name]
        lines.append(f"{record_name},,")
        zout.writestr(record_name, "\n".join(lines) + "\n")
    return dest


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        sys.exit(2)
    out = slim(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"{out}: {out.stat().st_size / 2**20:.1f} MiB")
