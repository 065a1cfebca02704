"""The decorator's options, checked once when ``settler.operation(...)`` is called."""

from __future__ import annotations

import dataclasses
from typing import Any

from settle.config import SettleConfig
from settle.decorator._identity import claim_identity
from settle.decorator._plan import Policy, ReplayHook, RetrySpec, TerminalSpec
from settle.decorator._signature import KeySpec, PrincipalSpec, RequestSpec, Signature

__all__ = ["Options"]


class Options:
    """What ``settler.operation(...)`` was given; :meth:`prepare` binds it to a function."""

    def __init__(
        self,
        config: SettleConfig,
        *,
        key: KeySpec,
        principal: PrincipalSpec,
        fingerprint: RequestSpec | None,
        result_type: Any,
        lease: float | None,
        timeout: float | None,
        retry: RetrySpec | None,
        terminal: TerminalSpec,
        wait: float,
        name: str | None = None,
        on_replay: ReplayHook | None = None,
        place: str = "redis",
    ) -> None:
        #: Where the settler's records live ("redis", or an in-process keyspace's token):
        #: with the namespace, what two definitions must share to collide.
        self.place = place
        self.key = key
        self.name = name
        self.principal = principal
        self.fingerprint = fingerprint
        self.result_type = result_type
        self.policy = Policy.check(
            namespace=config.namespace,
            lease=config.lease if lease is None else lease,
            timeout=timeout,
            retry=retry,
            terminal=terminal,
            wait=wait,
            on_replay=on_replay,
            result_type=lambda: result_type,  # replaced by prepare(): the function's type
        )

    def prepare(self, fn: Any, localns: dict[str, Any]) -> tuple[Signature, Policy]:
        signature = Signature(
            fn, self.key, self.principal, self.fingerprint, self.result_type, localns, self.name
        )
        if self.name is None:  # an explicit name= shares operations on purpose
            assert signature.name is not None
            claim_identity(self.place, self.policy.namespace, signature.name, fn, self.key)
        return signature, dataclasses.replace(self.policy, result_type=signature.returns)
