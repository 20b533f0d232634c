"""The one argparse tree: every subcommand registered, help on every option, one-line errors."""

import argparse
import subprocess
import sys

import pytest

from kernaudit_pipeline import cli


def _kernaudit(*args, env=None):
    return subprocess.run([sys.executable, "-m", "kernaudit_pipeline.cli", *args],
                          capture_output=True, text=True, env=env)


def _subparsers(parser):
    for action in parser._actions:  # argparse keeps subparsers here; there is no public accessor
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def test_every_command_is_registered():
    assert set(_subparsers(cli.build_parser())) == set(cli.COMMANDS)


def test_every_option_has_help_without_rst_markup():
    for name, parser in _subparsers(cli.build_parser()).items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or not parser.add_help:
                continue
            assert action.help, f"kernaudit {name} {action.option_strings or action.dest}: no help text"
            assert "``" not in action.help and ":func:" not in action.help, (name, action.help)


@pytest.mark.parametrize("args", [["nope"], ["synth", "--bogus"], ["synth", "--seed", "x"]])
def test_bad_usage_is_one_line_exit_2(args):
    res = _kernaudit(*args)
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "Traceback" not in res.stderr


def test_internal_error_is_one_line_with_a_log(tmp_path, monkeypatch):
    """An unexpected exception becomes one line naming a log file in the data folder."""
    monkeypatch.setenv("KERNAUDIT_DATA_DIR", str(tmp_path))

    def boom(args):
        raise ZeroDivisionError("deep inside")

    monkeypatch.setattr(cli, "build_parser", lambda: _BoomParser(boom))
    rc = cli.main(["synth"])
    assert rc == cli.EXIT_FAILURE
    logs = list((tmp_path / "logs").glob("synth-*.log"))
    assert len(logs) == 1 and "ZeroDivisionError" in logs[0].read_text()


class _BoomParser(cli.Parser):
    def __init__(self, fn):
        super().__init__(prog="kernaudit")
        self._fn = fn

    def parse_args(self, argv=None, namespace=None):  # noqa: D102
        return argparse.Namespace(_run=self._fn)
