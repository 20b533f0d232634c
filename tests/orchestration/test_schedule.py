"""The nightly schedule: configurable cron string and time zone, validated at load."""

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from dagster import DagsterInstance, build_schedule_context

from kernaudit_pipeline.defs.schedules import (CRON_ENV, TIMEZONE_ENV, ScheduleConfigError, build_nightly_schedule,
                                               nightly_timing)


def test_defaults_are_two_am_utc():
    assert nightly_timing({}) == ("0 2 * * *", "UTC")
    assert nightly_timing({CRON_ENV: " ", TIMEZONE_ENV: ""}) == ("0 2 * * *", "UTC")


def test_environment_overrides(monkeypatch):
    monkeypatch.setenv(CRON_ENV, "30 3 * * 1-5")
    monkeypatch.setenv(TIMEZONE_ENV, "Europe/Paris")
    schedule = build_nightly_schedule("audit_job")
    assert schedule.cron_schedule == "30 3 * * 1-5" and schedule.execution_timezone == "Europe/Paris"


@pytest.mark.parametrize("env, message", [
    ({CRON_ENV: "every night"}, "is not a cron string"),
    ({CRON_ENV: "0 25 * * *"}, "is not a cron string"),
    ({TIMEZONE_ENV: "Mars/Olympus"}, "is not an IANA time zone"),
])
def test_bad_values_give_one_line_reasons(env, message):
    with pytest.raises(ScheduleConfigError, match=message) as info:
        nightly_timing(env)
    assert "\n" not in str(info.value)


def test_a_tick_requests_the_full_audit_tagged_nightly():
    schedule = build_nightly_schedule("audit_job", cron="0 2 * * *", timezone="America/New_York")
    with DagsterInstance.ephemeral() as instance:
        when = datetime(2026, 3, 10, 2, 0, tzinfo=ZoneInfo("America/New_York"))
        context = build_schedule_context(instance=instance, scheduled_execution_time=when)
        result = schedule.evaluate_tick(context)
    assert len(result.run_requests) == 1
    request = result.run_requests[0]
    assert request.tags["kernaudit/trigger"] == "nightly"
    assert request.run_config == {}  # the whole audit: no kernel restriction
    ticks = schedule.cron_schedule, schedule.execution_timezone
    assert ticks == ("0 2 * * *", "America/New_York")


def test_validation_uses_no_private_dagster_api():
    import kernaudit_pipeline.defs.schedules as schedules

    source = open(schedules.__file__).read()
    assert "dagster._" not in source
