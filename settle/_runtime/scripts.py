"""A part's Lua scripts, assembled once: ``prelude.lua`` (this package's helpers every part
needs), then the part's own libraries, then the script's file. Redis has no ``require``;
this is it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib.resources import files

__all__ = ["ScriptSet"]


def _read(package: str, name: str) -> str:
    return (files(package) / "lua" / f"{name}.lua").read_text(encoding="utf-8")


@dataclass(frozen=True)
class ScriptSet:
    """``scripts`` maps each script name to the part libraries it is built on (in order);
    ``writing`` names the scripts that may write (followed by WAIT with ``min_replicas``)."""

    package: str
    scripts: Mapping[str, tuple[str, ...]]
    writing: frozenset[str]
    sources: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        unknown = self.writing - set(self.scripts)
        if unknown:
            raise ValueError(f"writing scripts that are not in the set: {sorted(unknown)}")
        prelude = _read("settle._runtime", "prelude")
        built = {}
        for name, libs in self.scripts.items():
            parts = [
                prelude,
                *(_read(self.package, lib) for lib in libs),
                _read(self.package, name),
            ]
            built[name] = "\n".join(parts)
        object.__setattr__(self, "sources", built)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.scripts)

    def __iter__(self) -> Iterator[str]:
        return iter(self.scripts)

    def source(self, name: str) -> str:
        return self.sources[name]
