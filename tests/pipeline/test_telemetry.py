"""Nothing leaves the data folder: MLflow's usage telemetry stays off.

MLflow 3 starts a telemetry client when it is imported; it writes an installation id under
``~/.config/mlflow`` and sends events over the network. It switches itself off under pytest or
a CI variable, so the check runs in a child process with a bare environment (a fresh HOME, no
CI variables), as a user's shell would be.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, sys
from pathlib import Path
import kernaudit_pipeline.tracking  # the product's way in: it imports mlflow
import mlflow
from mlflow.telemetry import get_telemetry_client
data = Path(sys.argv[1])
data.mkdir()
mlflow.set_tracking_uri(f"sqlite:///{data / 'mlflow.db'}")
with mlflow.start_run():
    mlflow.log_metric("speedup", 1.2)
print(json.dumps({"client": get_telemetry_client() is not None}))
"""


def _bare_env(home: Path, **extra: str) -> dict[str, str]:
    keep = {k: os.environ[k] for k in ("PATH", "LANG", "TMPDIR") if k in os.environ}
    return {**keep, "HOME": str(home), "PYTHONPATH": str(ROOT), **extra}


def _files_under(root: Path, skip: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and skip not in p.parents)


def test_mlflow_telemetry_is_off_and_writes_nothing_in_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    data = home / "data"
    done = subprocess.run([sys.executable, "-c", CHILD, str(data)], capture_output=True, text=True,
                          env=_bare_env(home), cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"client": False}
    assert _files_under(home, data) == []  # no ~/.config/mlflow/telemetry.json, nothing else
    assert (data / "mlflow.db").is_file()


def test_a_user_may_still_opt_in(tmp_path):
    """The package sets a default, not a rule: an explicit MLFLOW_DISABLE_TELEMETRY is left alone."""
    home = tmp_path / "home"
    home.mkdir()
    code = ("import kernaudit_pipeline, os, json; "
            "print(json.dumps(os.environ['MLFLOW_DISABLE_TELEMETRY']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_bare_env(home, MLFLOW_DISABLE_TELEMETRY="false"), cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == "false"
