"""One real audit (in-process, temporary DAGSTER_HOME, MLflow store and data folder)
for all browser tests, and the Chromium they drive."""

import os
from dataclasses import dataclass
from pathlib import Path

import mlflow
import pytest

from tests.browser.harness import CHROMIUM


@dataclass(frozen=True)
class Audited:
    run_id: str
    report_dir: Path
    data_dir: Path
    dagster_home: Path


def pytest_collection_modifyitems(config, items):
    """Without Debian's chromium the browser tests skip on a workstation; in CI (where
    scripts/browser_deps.sh installs it) they run, and fail if it is missing."""
    if CHROMIUM.exists() or os.environ.get("CI"):
        return
    skip = pytest.mark.skip(reason=f"{CHROMIUM} is missing: run scripts/browser_deps.sh")
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def audited(tmp_path_factory) -> Audited:
    from kernaudit_pipeline.audit import run_audit
    from tests.report.inputs import sample_files

    root = tmp_path_factory.mktemp("browser") / "data"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNAUDIT_DATA_DIR", str(root))
        mp.setenv("DAGSTER_HOME", str(root / "dagster_home"))
        mp.delenv("ANTHROPIC_API_KEY", raising=False)
        # no static compile here: with it, verifying every recommendation recompiles for minutes
        result, report_dir = run_audit({"sources": [str(p) for p in sample_files()], "static_enabled": False},
                                       quiet=True)
    mlflow.set_tracking_uri(None)
    assert result.success
    return Audited(result.run_id, report_dir, root, root / "dagster_home")
