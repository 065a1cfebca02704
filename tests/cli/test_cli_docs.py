"""The JSON that docs/cli.md shows is the JSON settle prints: each documented ``--json``
command is run on what ``settle demo --ops 60 --seed 42`` (the doc's run) left on a real
redis-server, and its output has the doc's fields, their types, and generations of the
size settle issues (server microseconds, docs/concepts.md "Generations")."""

from __future__ import annotations

import json
import re
import shlex
import socket
import tomllib
import uuid
from pathlib import Path
from typing import Any

import redis

from settle import Settler
from tests.cli.conftest import cli_env, settle

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
#: The commands whose documented output is JSON, as the doc runs them.
JSON_COMMANDS = (
    "settle stats --json",
    "settle inspect charge:{prefix}-0032 --json",
    "settle quarantine ls --json --limit 1",
    "settle quarantine export | head -1",
)


def documented(command: str) -> str:
    """The output docs/cli.md shows under ``$ command`` (up to the next prompt or fence)."""
    text = DOC.read_text(encoding="utf-8")
    for block in re.findall(r"```console\n(.*?)```", text, flags=re.S):
        for run in re.split(r"^\$ ", block, flags=re.M)[1:]:
            line, _, output = run.partition("\n")
            if re.sub(r"charge:[0-9a-f]{6}-", "charge:{prefix}-", line) == command:
                return output
    raise AssertionError(f"docs/cli.md no longer shows `{command}`")


def shape(value: Any, key: str = "") -> Any:
    """What a reader relies on: the fields, their types, a generation's digit count."""
    if isinstance(value, dict):
        return {k: shape(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value[:1]]
    if key == "generation" and isinstance(value, int):
        return f"generation of {len(str(value))} digits"
    return type(value).__name__


def test_the_documented_json_is_what_settle_prints(redis_url: str) -> None:
    namespace = f"clidoc{uuid.uuid4().hex[:8]}"
    env = cli_env(SETTLE_REDIS_URL=redis_url, SETTLE_NAMESPACE=namespace)
    demo = settle("demo", "--ops", "60", "--seed", "42", env=env, timeout=300)
    assert demo.returncode == 0, demo.stderr[-2000:]
    [late] = [
        entry["operation_id"]
        for entry in json.loads(settle("quarantine", "ls", "--json", env=env).stdout)
        if entry["operation_id"].endswith("-0032")
    ]
    prefix = late.removeprefix("charge:").removesuffix("-0032")

    differ = []
    for command in JSON_COMMANDS:
        doc_output = documented(command)
        args = shlex.split(command.format(prefix=prefix).removesuffix(" | head -1"))[1:]
        done = settle(*args, env=env)
        assert done.returncode == 0, (command, done.stderr)
        if command.endswith("| head -1"):
            doc_json = json.loads(doc_output.splitlines()[0])
            real_json = json.loads(done.stdout.splitlines()[0])
        else:
            doc_json = json.loads(doc_output)
            real_json = json.loads(done.stdout)
        if shape(doc_json) != shape(real_json):
            differ.append((command, shape(doc_json), shape(real_json)))
    assert differ == [], "\n".join(json.dumps(d, indent=1) for d in differ)


def test_the_command_list_names_every_command() -> None:
    """The list that opens docs/cli.md names each command ``settle --help`` lists."""
    done = settle("--help")
    assert done.returncode == 0, done.stderr
    commands = re.findall(r"^  ([a-z]+) ", done.stdout.split("Commands:", 1)[1], flags=re.M)
    assert commands
    text = DOC.read_text(encoding="utf-8")
    listing = text[text.index("```\n") + 4 :]
    listing = listing[: listing.index("```")]
    listed = re.findall(r"^settle ([a-z]+) ", listing, flags=re.M)
    assert sorted(listed) == sorted(commands)
    quarantine = settle("quarantine", "--help").stdout.split("Commands:", 1)[1]
    subcommands = re.findall(r"^  ([a-z]+) ", quarantine, flags=re.M)
    [line] = [line for line in listing.splitlines() if line.startswith("settle quarantine ")]
    assert sorted(line.split(None, 2)[2].split(" | ")) == sorted(subcommands)
    for sub in subcommands:
        assert f"### `{sub}" in text, f"docs/cli.md has no section on quarantine {sub}"


def test_the_documented_errors_are_what_settle_prints(redis_url: str, namespace: str) -> None:
    """The error transcript of docs/cli.md ("Exit codes"), each command run as written on
    a namespace of 16 shards (the doc's ``shop``, its URL and its unreachable port put to the
    test's): the same lines on stderr and stdout, the same exit code."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index("$ settle stats --redis-url redis://127.0.0.1:6390/0; echo $?")
    block = text[start : text.index("```", start)]
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    url = redis_url.rstrip("/").rsplit("/", 1)[0] + "/0"
    swaps = {
        "redis://127.0.0.1:6390/0": f"redis://127.0.0.1:{closed}/0",
        "127.0.0.1:6390": f"127.0.0.1:{closed}",
        "redis://127.0.0.1:16399/0": url,
        "shop": namespace,
    }
    for doc, here in swaps.items():
        block = block.replace(doc, here)
    with Settler.from_url(url, namespace=namespace) as settler:
        settler.check()  # the namespace exists, with 16 shards
    env = cli_env(SETTLE_REDIS_URL=url, SETTLE_NAMESPACE=namespace)
    runs = re.split(r"^\$ ", block, flags=re.M)[1:]
    assert len(runs) == 8
    for run in runs:
        line, _, shown = run.partition("\n")
        command = line.removesuffix("; echo $?")
        if command.startswith("redis-cli "):  # what it does, through redis-py
            with redis.Redis.from_url(url) as client:
                client.hset(f"settle:{{{namespace}}}:meta", "shards", "many")
            command = command.split("; ", 1)[1]
        args = shlex.split(command)[1:]
        done = settle(*args, env=env)
        expected, _, code = shown.rstrip("\n").rpartition("\n")
        assert (done.stdout + done.stderr).rstrip("\n") == expected, command
        assert str(done.returncode) == code, command


def test_the_install_line_installs_the_command_line() -> None:
    """docs/cli.md opens with what to install: that brings click and rich (the console
    script without them says only that the ``cli`` extra is missing, exit 2)."""
    project = tomllib.loads((DOC.parents[1] / "pyproject.toml").read_text("utf-8"))["project"]
    extras: dict[str, list[str]] = project["optional-dependencies"]

    def installs(extra: str) -> set[str]:
        found: set[str] = set()
        for requirement in extras[extra]:
            name = re.split(r"[\[<>=! ]", requirement, maxsplit=1)[0]
            if name == "settle-sdk":
                inner = requirement[requirement.index("[") + 1 : requirement.index("]")]
                found |= {n for e in inner.split(",") for n in installs(e.strip())}
            else:
                found.add(name)
        return found

    opening = DOC.read_text(encoding="utf-8").split("\n## ", 1)[0]
    named = re.findall(r"pip install '?settle-sdk(?:\[([a-z,]+)\])?'?", opening)
    assert named, "docs/cli.md no longer says what to install"
    for group in named:
        got = {n for e in group.split(",") if e for n in installs(e)}
        assert {"click", "rich"} <= got, f"pip install settle-sdk[{group}] lacks click / rich"
