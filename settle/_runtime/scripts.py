"""A part's Lua scripts, assembled once: ``prelude.lua`` (this package's helpers every part
needs), then the part's own libraries, then the script's file. Redis has no ``require``;
this is it.

Two shapes come out of one set of files (SPEC 4):

* :meth:`ScriptSet.source`: one EVAL script per script name (Redis 6.2 runs these by
  EVALSHA); the prelude and the libraries run again on every call. A script with a *head*
  (``heads``: a fast path that answers the common read before any part library is
  defined) is the prelude, the ``head_libs`` its head uses (``head_uses``; all of them by
  default), the head, then the libraries and the script. A script's own libraries may name
  a head library (one a head and the whole script both use): it is defined once, with the
  head's where its head uses it.
* :attr:`ScriptSet.library`: one FUNCTION library for Redis 7+ and Valkey, loaded once; the
  prelude and each group of part libraries are defined once at load, and each script body
  becomes one registered function. Its name and every function name carry a hash of the
  library's text, so two settle versions on one server (a rolling deploy) never replace each
  other's functions.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib.resources import files

from settle._runtime.topology import hash_tag

__all__ = ["WAIT_PROBE", "ScriptSet", "wait_probe_key"]

#: Stands for ``settle_<hash>`` in the library's text until its hash is known.
_PREFIX = "@@settle@@"

#: The runtime's own script in every set: the write after a writing script that makes its
#: ``WAIT`` cover every earlier write of the server (``lua/wait_probe.lua``).
WAIT_PROBE = "wait_probe"


def wait_probe_key(key: str) -> str:
    """The key :data:`WAIT_PROBE` writes for a call whose first key is ``key``: in its slot
    (its hash tag, or the whole key when it has none), under ``settle:`` as every key an ACL
    grants settle. Every part's keys carry a tag, or (a user's stream) have no ``}`` when
    they have none, so the tag written here is the one Redis Cluster reads."""
    return f"settle:{{{hash_tag(key) or key}}}:wait"


def _read(package: str, name: str) -> str:
    return (files(package) / "lua" / f"{name}.lua").read_text(encoding="utf-8")


@dataclass(frozen=True)
class ScriptSet:
    """``scripts`` maps each script name to the part libraries it is built on (in order);
    ``writing`` names the scripts that may write (followed by WAIT with ``min_replicas``);
    ``read_only`` names the scripts that never write at all (registered with the
    ``no-writes`` flag as functions, so they also run on a full server, as EVAL scripts do).
    ``heads`` maps a script to its head file, which runs first and may answer on its own,
    using only the prelude and ``head_libs``; ``head_uses`` names the head libraries a
    head's EVAL script defines before it (in ``head_libs`` order; all of them for a head it
    does not name), as every EVALSHA on Redis 6.2 defines each helper it holds again (the
    FUNCTION library defines every head library once). A script whose rules use a head
    library names it among its own libraries too (it is defined once all the same).
    ``gone`` names the scripts a part calls only on state it has just read (the cursor's
    checkpoint, the first element of their reply's body): a reply of theirs in which that
    state is empty says the server lost it meanwhile (a FLUSHALL, a restart without
    persistence, a DEL), evidence on which the runner checks the server again before its
    next call. ``lost`` names reply codes (the reply's first element) of the set's scripts
    that are the same evidence (the stream settlement's ``no_group``: the group it read the
    delivery from is gone; a progress write's ``unclaimed``). (The core's ``unclaimed`` is
    the settler's to judge: its core says a loss once for every call that found it.)

    Every set also holds the runtime's :data:`WAIT_PROBE` (added here; a part never calls
    it): with ``min_replicas`` the runner sends it between a writing script and its WAIT."""

    package: str
    scripts: Mapping[str, tuple[str, ...]]
    writing: frozenset[str]
    read_only: frozenset[str] = frozenset()
    heads: Mapping[str, str] = field(default_factory=dict)
    head_libs: tuple[str, ...] = ()
    head_uses: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    gone: frozenset[str] = frozenset()
    lost: frozenset[str] = frozenset()
    sources: dict[str, str] = field(init=False, repr=False, compare=False)
    library: str = field(init=False, repr=False, compare=False)
    library_name: str = field(init=False, repr=False, compare=False)
    functions: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        unknown = (self.writing | self.read_only | self.gone) - set(self.scripts)
        if unknown:
            raise ValueError(f"scripts that are not in the set: {sorted(unknown)}")
        if set(self.heads) - set(self.scripts):
            unknown_heads = sorted(set(self.heads) - set(self.scripts))
            raise ValueError(f"heads of scripts that are not in the set: {unknown_heads}")
        if set(self.head_uses) - set(self.heads):
            headless = sorted(set(self.head_uses) - set(self.heads))
            raise ValueError(f"head_uses of scripts without a head: {headless}")
        used = {lib for uses in self.head_uses.values() for lib in uses}
        if used - set(self.head_libs):
            raise ValueError(
                f"head_uses names libraries not in head_libs: {sorted(used - set(self.head_libs))}"
            )
        if self.writing & self.read_only:
            raise ValueError(f"scripts both writing and read-only: {self.writing & self.read_only}")
        if self.scripts.get(WAIT_PROBE, ()) != ():  # () is a set's copy (``replace``)
            raise ValueError(f"{WAIT_PROBE!r} is the runtime's own script in every set")
        object.__setattr__(self, "scripts", {**self.scripts, WAIT_PROBE: ()})
        prelude = _read("settle._runtime", "prelude")
        libs = {lib: _read(self.package, lib) for deps in self.scripts.values() for lib in deps}
        head_libs = {lib: _read(self.package, lib) for lib in self.head_libs}
        uses = {
            name: tuple(
                lib for lib in self.head_libs if lib in self.head_uses.get(name, self.head_libs)
            )
            for name in self.heads
        }
        heads = {name: _read(self.package, head) for name, head in self.heads.items()}
        bodies = {
            name: _read("settle._runtime" if name == WAIT_PROBE else self.package, name)
            for name in self.scripts
        }
        built = {
            name: bodies[name]  # a write alone: no helper of the prelude
            if name == WAIT_PROBE
            else "\n".join(
                [
                    prelude,
                    *(head_libs[lib] for lib in uses.get(name, ())),
                    *((heads[name],) if name in heads else ()),
                    *(libs[lib] for lib in deps if lib not in uses.get(name, ())),
                    bodies[name],
                ]
            )
            for name, deps in self.scripts.items()
        }
        object.__setattr__(self, "sources", built)
        template = self._library_template(
            "\n".join([prelude, *head_libs.values()]),
            libs,
            {
                name: "\n".join([heads[name], body]) if name in heads else body
                for name, body in bodies.items()
            },
        )
        prefix = "settle_" + hashlib.sha1(template.encode(), usedforsecurity=False).hexdigest()[:8]
        part = self.part
        object.__setattr__(self, "library", template.replace(_PREFIX, prefix))
        object.__setattr__(self, "library_name", prefix)
        object.__setattr__(
            self, "functions", {name: f"{prefix}_{part}_{name}" for name in self.scripts}
        )

    def _library_template(
        self, prelude: str, libs: Mapping[str, str], bodies: Mapping[str, str]
    ) -> str:
        """The library with :data:`_PREFIX` for its name. A script body reads the globals
        KEYS and ARGV and ends in a top-level ``return``: it becomes the body of its
        function's callback, which first points the chunk's ``KEYS`` / ``ARGV`` locals at
        the call's and clears what a head left for its script (``HEAD_*``, see prelude.lua;
        part libraries read them too; a function may not set globals, and the server runs
        one call at a time). Scripts on the same part libraries share one
        ``do ... end`` block that defines those libraries once."""
        part = self.part
        out = [
            f"#!lua name={_PREFIX}",
            f"-- settle's {self.package} scripts as one FUNCTION library, assembled by",
            "-- settle._runtime.scripts from the files of that package (do not edit here).",
            "local KEYS, ARGV",
            prelude,
        ]
        groups: dict[tuple[str, ...], list[str]] = {}
        for name, deps in self.scripts.items():
            # The head libraries are defined above, once for every script.
            own = tuple(lib for lib in deps if lib not in self.head_libs)
            groups.setdefault(own, []).append(name)
        for deps, names in groups.items():
            out.append("do")
            out.extend(libs[lib] for lib in deps)
            for name in names:
                flags = (
                    ", flags = {'no-writes'}"
                    if name in self.read_only
                    # Runs on a full server too: its PEXPIRE grows nothing, and a tag's
                    # first probe makes one small key (see lua/wait_probe.lua).
                    else ", flags = {'allow-oom'}"
                    if name == WAIT_PROBE
                    else ""
                )
                out += [
                    "redis.register_function{",
                    f"  function_name = '{_PREFIX}_{part}_{name}',",
                    "  callback = function(keys, args)",
                    "KEYS, ARGV, HEAD_BLOB, HEAD_NOW, HEAD_US = keys, args, nil, nil, nil",
                    bodies[name],
                    f"end{flags}}}",
                ]
            out.append("end")
        return "\n".join(out) + "\n"

    @property
    def part(self) -> str:
        """The part's short name in function names: core, cursor, progress, sessions (of
        a private package, ``settle._sessions``, without its underscore)."""
        last = self.package.rsplit(".", 1)[-1].lstrip("_")
        return "core" if last == "settle" else last

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.scripts)

    def __iter__(self) -> Iterator[str]:
        return iter(self.scripts)

    def source(self, name: str) -> str:
        return self.sources[name]

    def function(self, name: str) -> str:
        """The registered function name of script ``name`` in :attr:`library`."""
        return self.functions[name]
