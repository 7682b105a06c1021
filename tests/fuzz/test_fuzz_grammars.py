"""Fuzzing the grammars built from clients' JSON schemas (edgeserve/grammars.py) and their
compilation by llama.cpp. Converting a schema (a response format, a tool's parameters) gives
GBNF or a GrammarError, never another exception (nor running out of memory); a forced tool
call always gets a grammar. llama.cpp compiles every grammar the server would make, or refuses
it (a 400), and walks it token by token without aborting or hanging: that runs in a worker
process (tests/fuzz/grammar_worker.py), so a llama.cpp abort fails the test with the grammar
that caused it instead of killing the test run."""

from __future__ import annotations

import json
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from edgeserve.grammars import GrammarError, either, schema_grammar, tool_call_grammar
from tests.fuzz.budget import fuzz_settings
from tests.fuzz.json_strategies import as_decoded
from tests.fuzz.memory import bounded_memory, limit_address_space
from tests.fuzz.schema_strategies import schemas
from tests.fuzz.server import REPO

ANSWER_TIMEOUT_S = 60
WORKER_MEMORY_BYTES = 4 << 30
"""The worker's address-space limit (tests/fuzz/memory.py): a grammar whose states outgrow it
fails there (a std::bad_alloc abort, a finding)."""
WALK_STEPS = 12

decoded_schemas = as_decoded(schemas())
tool_names = st.one_of(
    st.sampled_from(["get_weather", "f", "a b", '"', "\\", ""]), st.text(max_size=6)
)


class WorkerDied(AssertionError):
    """The grammar worker ended (llama.cpp aborted) or stopped answering."""


class GrammarWorker:
    """The grammar worker process, started again after it dies."""

    def __init__(self, model_path: Path, log_path: Path) -> None:
        self.model_path = model_path
        self.log_path = log_path
        self.proc: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        with self.log_path.open("a") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.fuzz.grammar_worker", str(self.model_path)],
                cwd=REPO,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                preexec_fn=limit_address_space(WORKER_MEMORY_BYTES),
            )
        self.proc = proc
        self._answer(proc)
        return proc

    def _answer(self, proc: subprocess.Popen[str]) -> dict[str, Any]:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], ANSWER_TIMEOUT_S)
        line = proc.stdout.readline() if ready else ""
        if not line:
            proc.kill()
            proc.communicate()
            code = proc.returncode
            self.proc = None
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise WorkerDied(f"the grammar worker ended (exit {code}) or hung:\n{tail}")
        return json.loads(line)

    def run(self, gbnf: str, seed: int) -> dict[str, Any]:
        """Compile `gbnf` in the worker and walk it; WorkerDied if that kills or hangs it."""
        proc = self.proc if self.proc is not None and self.proc.poll() is None else self._start()
        assert proc.stdin is not None
        request = {"gbnf": gbnf, "seed": seed, "steps": WALK_STEPS}
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            pass
        return self._answer(proc)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture(scope="module")
def grammar_worker(
    model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GrammarWorker]:
    worker = GrammarWorker(model_path, tmp_path_factory.mktemp("grammar-worker") / "stderr.log")
    yield worker
    worker.close()


def grammar_or_none(schema: Any) -> str | None:
    """The schema's grammar, or None when it is refused (with a GrammarError only, and not for
    running out of memory: the converter's catch-all would turn a MemoryError into one)."""
    try:
        with bounded_memory():
            return schema_grammar(schema)
    except GrammarError as exc:
        assert str(exc)
        assert not isinstance(exc.__cause__, MemoryError), exc
        return None


@fuzz_settings(300)
@given(schema=decoded_schemas)
@example(
    schema={"type": "array", "items": {"type": "integer"}, "minItems": -(10**9), "maxItems": 1}
)
@example(schema={"type": "string", "pattern": "^a{-1000000000,1}$"})
def test_schemas_convert_or_are_refused_with_a_grammar_error(schema: Any) -> None:
    gbnf = grammar_or_none(schema)
    assert gbnf is None or "root ::=" in gbnf


@fuzz_settings(150)
@given(
    functions=st.lists(
        st.tuples(tool_names, decoded_schemas.filter(lambda s: isinstance(s, dict))),
        min_size=1,
        max_size=3,
    )
)
def test_a_forced_tool_call_always_gets_a_grammar(
    functions: list[tuple[str, dict[str, Any]]],
) -> None:
    """It falls back to any JSON object for parameters it cannot convert (but not for running
    out of memory, which the fallback would hide: each is converted alone first)."""
    for _, parameters in functions:
        grammar_or_none(parameters)
    with bounded_memory():
        assert "root ::=" in tool_call_grammar(functions)


UNCONVERTIBLE_PARAMETERS = [
    {"type": "object", "properties": {"a": {"enum": []}}},
    {"properties": {"a": {"type": "string"}, "b": {"anyOf": []}}, "required": ["a"]},
    {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^\\d{5}$"}}},
    {"type": "object", "properties": {"v": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+$"}}},
]


@pytest.mark.needs_model
@pytest.mark.parametrize("parameters", UNCONVERTIBLE_PARAMETERS)
def test_a_forced_call_of_a_tool_whose_parameters_cannot_convert_compiles(
    grammar_worker: GrammarWorker, parameters: dict[str, Any]
) -> None:
    """Found by the fuzzing below: the converter wrote an empty union as an empty rule and
    copied regex escapes (\\d, \\.) into GBNF, and llama.cpp refused the grammar, so a forced
    call of such a tool was a 400 ("check its GBNF syntax"); its arguments now fall back to
    any JSON object."""
    assert grammar_worker.run(tool_call_grammar([("f", parameters)]), seed=0)["compiled"]


@pytest.mark.needs_model
def test_the_character_classes_a_refusal_suggests_compile(grammar_worker: GrammarWorker) -> None:
    schema = {"type": "string", "pattern": "^[0-9]+[.][0-9]+$"}
    assert grammar_worker.run(schema_grammar(schema), seed=0)["compiled"]


@pytest.mark.needs_model
@fuzz_settings(120)
@given(
    schema=decoded_schemas,
    functions=st.lists(
        st.tuples(tool_names, decoded_schemas.filter(lambda s: isinstance(s, dict))), max_size=2
    ),
    seed=st.integers(0, 2**16),
)
def test_every_grammar_the_server_makes_compiles_or_is_refused_and_walks_in_llama_cpp(
    grammar_worker: GrammarWorker,
    schema: Any,
    functions: list[tuple[str, dict[str, Any]]],
    seed: int,
) -> None:
    """The response format's grammar, the forced call's, and chat's union of the two (tools
    the model may call, or an answer in the format): llama.cpp compiles each and walks it, or
    refuses it (a 400: left recursion through a `$ref`, or more repetition than it allows);
    it never aborts or hangs."""
    answer = grammar_or_none(schema)
    grammars = [answer] if answer is not None else []
    if functions:
        for _, parameters in functions:
            grammar_or_none(parameters)
        with bounded_memory():
            call = tool_call_grammar(functions)
        grammars += [call] + ([either([call, answer])] if answer is not None else [])
    for gbnf in grammars:
        result = grammar_worker.run(gbnf, seed)
        event("compiled" if result["compiled"] else "refused by llama.cpp")
