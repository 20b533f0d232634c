"""The nightly full audit, at a configurable time.

``KERNAUDIT_NIGHTLY_CRON`` (default ``0 2 * * *``) and
``KERNAUDIT_NIGHTLY_TIMEZONE`` (default ``UTC``, any IANA name) are read when
the definitions load; a bad value stops the load with a one-line reason.
"""


import os
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dagster import DagsterInvalidDefinitionError, DefaultScheduleStatus, ScheduleDefinition

from kernaudit_pipeline.defs.run_tags import TRIGGER_TAG

CRON_ENV = "KERNAUDIT_NIGHTLY_CRON"
TIMEZONE_ENV = "KERNAUDIT_NIGHTLY_TIMEZONE"
DEFAULT_CRON = "0 2 * * *"
DEFAULT_TIMEZONE = "UTC"


class ScheduleConfigError(ValueError):
    pass


def nightly_timing(environ: dict[str, str] | None = None) -> tuple[str, str]:
    """(cron string, timezone) from the environment, validated."""
    env = os.environ if environ is None else environ
    cron = env.get(CRON_ENV, "").strip() or DEFAULT_CRON
    tz = env.get(TIMEZONE_ENV, "").strip() or DEFAULT_TIMEZONE
    try:  # Dagster's own validation, through its public constructor
        ScheduleDefinition(name="nightly_audit_check", job_name="audit_job", cron_schedule=cron)
    except DagsterInvalidDefinitionError:
        raise ScheduleConfigError(f"{CRON_ENV}={cron!r} is not a cron string (e.g. {DEFAULT_CRON!r})") from None
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleConfigError(f"{TIMEZONE_ENV}={tz!r} is not an IANA time zone (e.g. 'Europe/Paris')") from None
    return cron, tz


def build_nightly_schedule(job_name: str = "audit_job", cron: str | None = None,
                           timezone: str | None = None) -> ScheduleDefinition:
    env_cron, env_tz = nightly_timing()
    return ScheduleDefinition(
        name="nightly_audit", job_name=job_name, cron_schedule=cron or env_cron,
        execution_timezone=timezone or env_tz, tags={TRIGGER_TAG: "nightly"},
        default_status=DefaultScheduleStatus.RUNNING,
        description="The full audit every night; its audit_history is compared with the last accepted audit.",
    )
