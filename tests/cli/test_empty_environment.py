"""A ``SETTLE_*`` variable the CLI reads that is set but empty is refused, naming it: click
read ``SETTLE_NAMESPACE=`` as unset, so an operator who exported it empty by mistake looked
at namespace ``default`` (or ``localhost``'s Redis) and was told nothing."""

from __future__ import annotations

import pytest

from tests.cli.conftest import cli_env, settle

#: (command, variable): every SETTLE_* variable the CLI reads, in a command that reads it.
CASES = [
    (("stats",), "SETTLE_NAMESPACE"),
    (("quarantine", "ls"), "SETTLE_REDIS_URL"),
    (("inspect", "order-1"), "SETTLE_SHARDS"),
    (("stats",), "SETTLE_REDIS_TIMEOUT"),
    (("doctor",), "SETTLE_MIN_REPLICAS"),
    (("doctor",), "SETTLE_NAMESPACE"),
    (("doctor",), "SETTLE_QUARANTINE_MAXLEN"),
    (("cursor", "show", "c"), "SETTLE_NAMESPACE"),
    (("cursor", "show", "c"), "SETTLE_REDIS_URL"),
    (("progress", "show", "c"), "SETTLE_PROGRESS_REDIS_URL"),
    (("progress", "show", "c"), "SETTLE_NAMESPACE"),
    (("web", "--port", "0"), "SETTLE_WEB_TOKEN"),
]


@pytest.mark.parametrize("value", ["", "  "])
@pytest.mark.parametrize(("command", "variable"), CASES)
def test_an_empty_variable_is_refused_by_name(
    redis_url: str, command: tuple[str, ...], variable: str, value: str
) -> None:
    env = cli_env(**{variable: value})
    if variable != "SETTLE_REDIS_URL" and "SETTLE_PROGRESS" not in variable:
        env["SETTLE_REDIS_URL"] = redis_url
    done = settle(*command, env=env, timeout=30)
    assert done.returncode == 2, done.stderr
    assert f"{variable} is set but empty" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_a_flag_wins_over_an_empty_variable(redis_url: str) -> None:
    """The flag is what is used: the empty variable is not read, so not refused."""
    env = cli_env(SETTLE_NAMESPACE="", SETTLE_REDIS_URL=redis_url)
    done = settle("stats", "--namespace", "nowhere-env-flag", env=env, timeout=30)
    assert done.returncode == 3, done.stderr
    assert "namespace 'nowhere-env-flag' does not exist" in done.stderr


def test_an_empty_redis_url_flag_is_not_the_default() -> None:
    """``--redis-url ''`` (a variable expanded empty: ``--redis-url "$URL"``) is a malformed
    URL, not ``redis://localhost:6379/0``."""
    done = settle("stats", "--redis-url", "", env=cli_env(), timeout=30)
    assert done.returncode == 2, done.stderr
    assert "bad --redis-url" in done.stderr
    assert "localhost" not in done.stderr
