"""Click parameter types of the CLI."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import click

from settle.models import QuarantineKind

__all__ = ["KIND", "SINCE", "Ago", "FiniteRange", "since_on"]

_RELATIVE = re.compile(r"(\d+(?:\.\d+)?)([smhd])", re.ASCII)
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


@dataclass(frozen=True, slots=True)
class Ago:
    """A duration before "now", where now is the server's clock (stream ids and record
    times are server time): resolved with :func:`since_on` once connected."""

    delta: timedelta


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def since_on(value: datetime | Ago | None, server_now: datetime) -> datetime | None:
    """The instant ``--since`` means, given the server's current time."""
    # An instant before 1970 (or a duration reaching back past it, or past the year 1)
    # means "from the start": no entry is older than the stream ids' epoch, and Redis
    # refuses a stream id before it.
    if isinstance(value, Ago):
        try:
            return max(server_now - value.delta, _EPOCH)
        except OverflowError:
            return _EPOCH
    if value is not None and value < _EPOCH:
        return _EPOCH
    return value


class Since(click.ParamType):  # type: ignore[type-arg,unused-ignore]  # generic from click 8.2
    """An instant: ISO 8601 (naive means UTC) or a duration ago such as ``90s``, ``10m``,
    ``2h``, ``1d`` (an :class:`Ago`, counted back from the server's clock)."""

    name = "since"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, datetime | Ago):
            return value
        text = str(value).strip()
        match = _RELATIVE.fullmatch(text)
        if match:
            amount, unit = match.groups()
            try:
                return Ago(timedelta(**{_UNITS[unit]: float(amount)}))
            except OverflowError:
                self.fail(f"{text!r} is longer than a date can reach back", param, ctx)
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            self.fail(
                f"{text!r} is neither an ISO 8601 time (2026-12-02T09:30:00Z) nor a duration "
                "ago (90s, 10m, 2h, 1d)",
                param,
                ctx,
            )
        return when if when.tzinfo else when.replace(tzinfo=UTC)


class Duration(click.ParamType):  # type: ignore[type-arg,unused-ignore]  # generic from click 8.2
    """A length of time such as ``90s``, ``10m``, ``2h``, ``30d``: seconds, as a float."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, float):
            return value
        match = _RELATIVE.fullmatch(str(value).strip())
        if not match:
            self.fail(f"{value!r} is not a duration (90s, 10m, 2h, 30d)", param, ctx)
        amount, unit = match.groups()
        try:
            return timedelta(**{_UNITS[unit]: float(amount)}).total_seconds()
        except OverflowError:
            self.fail(f"{value!r} is longer than a date can reach", param, ctx)


class FiniteRange(click.FloatRange):
    """click's ``FloatRange`` that refuses NaN as it refuses a number out of its range:
    every comparison with NaN is False, so click's let ``--interval nan`` through, and the
    library then refused it in its own words, with its own range (``poll_interval must be a
    number of seconds from 0 to 3600``), not the option's."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if math.isnan(number):
            self.fail(f"{number} is not in the range {self._describe_range()}.", param, ctx)
        return number


SINCE = Since()
DURATION = Duration()
KIND = click.Choice([k.value for k in QuarantineKind])
