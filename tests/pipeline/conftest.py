"""Each pipeline test gets its own data folder, Dagster home and MLflow store."""

import pytest


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    root = tmp_path / "data"
    monkeypatch.setenv("KERNAUDIT_DATA_DIR", str(root))
    monkeypatch.setenv("DAGSTER_HOME", str(root / "dagster_home"))
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    return root
