"""mypy sees the decorated function's own signature (ParamSpec), sync and async."""

from __future__ import annotations

from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parents[2]

SNIPPET = """
from settle import AsyncSettler, Settler
from settle.attempt import Attempt

settler = Settler.from_url("redis://localhost")
asettler = AsyncSettler.from_url("redis://localhost")


@settler.operation(key="k:{n}", principal="p")
def job(n: int, note: str = "", attempt: Attempt = Attempt.INJECTED) -> str:
    return str(n)


@asettler.operation(key="k:{n}", principal="p")
async def ajob(n: int) -> str:
    return str(n)


reveal_type(job)
reveal_type(ajob)
job(1, note="x")
job("1")
"""


def test_decorated_functions_keep_their_signature_for_mypy(tmp_path: Path) -> None:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(SNIPPET)
    out, _, _ = api.run(["--strict", "--follow-imports=silent", "--no-error-summary", str(snippet)])
    lines = [
        line.split(": ", 1)[1].replace("builtins.", "")  # spelled either way across versions
        for line in out.splitlines()
        if "snippet.py" in line
    ]
    assert lines == [
        'note: Revealed type is "def (n: int, note: str =, attempt: '
        'settle.attempt.Attempt =) -> str"',
        'note: Revealed type is "def (n: int) -> typing.Coroutine[Any, Any, str]"',
        'error: Argument 1 to "job" has incompatible type "str"; expected "int"  [arg-type]',
    ]
