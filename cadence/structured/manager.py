"""The engine's grammar state: compiles off the loop, one matcher per constrained request.

Per request, in the engine core:

    submit(rid, params)    compile on a worker thread (or take it from the cache); the
                           request waits outside the scheduler until poll() says ready
    fill_bitmask(rows)     each step, between launching the forward pass and sampling: one
                           row of allowed tokens (bits) per sampling request
    advance(rid, token)    after sampling: the matcher accepts the token; returns the tokens
                           the grammar forces next (jump-forward), or [] if it is free
    remove(rid)            when the request finishes

Compiled grammars are cached by cache_key (LRU, `cache_size` entries): the same schema
compiles once. The vocabulary (xgrammar's TokenizerInfo) is built on first use, on the
worker thread, so servers that never see a constrained request never pay for it.

Each compile is bounded by `compile_timeout` seconds (--grammar-compile-timeout), counted
from when a worker starts it: past that, every request waiting on it fails with an error
naming the bound (the API answers 400), its thread is abandoned (see compile_pool), and the
grammar is remembered as too slow, so sending it again fails at once instead of tying up
another thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass

import torch

from cadence.sampling_params import StructuredOutputsParams
from cadence.structured.checked import CheckedMatcher, SchemaChecks, VocabText
from cadence.structured.compile_pool import CompileJob, CompilePool, CompilerBusy
from cadence.structured.grammar import cache_key, compile_grammar, runtime_schema
from cadence.structured.thinking import ThinkingMatcher

logger = logging.getLogger(__name__)


@dataclass
class GrammarStats:
    requests: int = 0  # constrained requests submitted
    compiles: int = 0  # grammars compiled (cache misses)
    cache_hits: int = 0
    compile_seconds: float = 0.0  # total, on worker threads
    timeouts: int = 0  # compiles abandoned past compile_timeout
    jump_forward_tokens: int = 0  # tokens appended without sampling


class GrammarManager:
    def __init__(
        self,
        tokenizer_path: str | None,
        vocab_size: int,
        stop_token_ids: tuple[int, ...],
        cache_size: int = 256,
        threads: int = 2,
        compile_timeout: float = 30.0,
        max_abandoned: int = 4,
    ) -> None:
        """`compile_timeout`: seconds one compile may run. `max_abandoned`: compiles past
        it whose threads may still run (each burns a core) before the pool shrinks."""
        self.tokenizer_path = tokenizer_path
        self.vocab_size = vocab_size
        self.stop_token_ids = list(stop_token_ids)
        self.cache_size = cache_size
        self.compile_timeout = compile_timeout
        self.stats = GrammarStats()
        self._compiler = None
        self._vocab: VocabText | None = None  # each token's text, with the compiler
        self._compiler_lock = threading.Lock()
        self._pool = CompilePool(threads, compile_timeout, max_abandoned, setup=self._get_compiler)
        # key -> (CompiledGrammar or None, SchemaChecks or None)
        self._cache: OrderedDict[str, tuple] = OrderedDict()
        self._inflight: dict[str, CompileJob] = {}  # key -> compile in progress
        # Keys whose compile ran past the timeout (LRU, `cache_size` entries): refused at once.
        self._too_slow: OrderedDict[str, None] = OrderedDict()
        # request id -> (key, params) of the grammar it waits for
        self._waiting: dict[str, tuple[str, StructuredOutputsParams]] = {}
        self.matchers: dict[str, object] = {}  # request id -> GrammarMatcher
        self._bitmask: torch.Tensor | None = None  # reused [rows, words] int32 buffer

    # ---- compiling --------------------------------------------------------------------

    def _get_compiler(self):
        with self._compiler_lock:
            if self._compiler is None:
                import xgrammar as xgr

                from cadence.tokenizer import load_tokenizer

                t0 = time.perf_counter()
                tokenizer = load_tokenizer(self.tokenizer_path)
                if tokenizer is None:
                    raise ValueError("structured outputs need the model's tokenizer; it has none")
                info = xgr.TokenizerInfo.from_huggingface(
                    tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
                )
                # Our own LRU cache sits in front; xgrammar's would grow without bound.
                self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
                self._vocab = VocabText(info.decoded_vocab, self.vocab_size)
                logger.info("grammar vocabulary ready in %.2f s", time.perf_counter() - t0)
            return self._compiler

    def _compile(self, params: StructuredOutputsParams):
        """((the compiled grammar, run-time checks or None), seconds)."""
        t0 = time.perf_counter()
        compiled = compile_grammar(self._get_compiler(), params)
        schema = runtime_schema(params)
        checks = SchemaChecks(schema) if schema is not None else None
        return (compiled, checks), time.perf_counter() - t0

    def _start(self, key: str, params: StructuredOutputsParams) -> None:
        self._inflight[key] = self._pool.submit(key, lambda: self._compile(params))

    def _timeout_message(self, again: bool) -> str:
        when = "an earlier compile of this grammar" if again else "the grammar"
        return (
            f"{when} did not compile within {self.compile_timeout:g} s, the limit set by "
            "--grammar-compile-timeout; simplify the schema (deeply nested anyOf and large "
            "bounded repetitions compile slowly) or raise the limit"
        )

    def submit(self, request_id: str, params: StructuredOutputsParams) -> None:
        """Start compiling (or find the cached grammar); never blocks."""
        key = cache_key(params)
        self.stats.requests += 1
        self._waiting[request_id] = (key, params)
        if key in self._cache:
            self.stats.cache_hits += 1
            self._cache.move_to_end(key)
        elif key in self._inflight:
            self.stats.cache_hits += 1
        elif key not in self._too_slow:  # a too-slow key fails in poll()
            self._start(key, params)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def poll(self, timeout: float = 0.0) -> tuple[list[str], list[tuple[str, str]]]:
        """(request ids now ready, [(request id, error)]) among those submitted.

        With a timeout and nothing ready, waits up to that long for a compile to finish
        (the loop has nothing else to do), but not past the earliest compile deadline."""
        if (
            timeout > 0
            and self._inflight
            and all(k in self._inflight for k, _ in self._waiting.values())
        ):
            deadline = self._pool.next_deadline()
            if deadline is not None:
                timeout = min(timeout, max(0.0, deadline - time.monotonic()))
            futures = [job.future for job in self._inflight.values()]
            wait(futures, timeout, return_when=FIRST_COMPLETED)
        errors: dict[str, str] = {}
        for job in self._pool.expired():
            if self._inflight.get(job.key) is job:
                del self._inflight[job.key]
                errors[job.key] = self._timeout_message(again=False)
                self._mark_too_slow(job.key)
                logger.warning(
                    "grammar compile abandoned after %g s (%d threads still running "
                    "abandoned compiles)",
                    self.compile_timeout,
                    self._pool.num_abandoned,
                )
        for key, job in list(self._inflight.items()):
            if not job.future.done():
                continue
            del self._inflight[key]
            try:
                compiled, seconds = job.future.result()
            except Exception as e:  # ValueError from a bad grammar, or a tokenizer problem
                known = isinstance(e, ValueError | CompilerBusy)
                errors[key] = str(e) if known else f"grammar failed: {e}"
                logger.warning("grammar compile failed: %s", errors[key])
                continue
            self.stats.compiles += 1
            self.stats.compile_seconds += seconds
            self._cache[key] = compiled
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        ready, failed = [], []
        import xgrammar as xgr

        for rid, (key, params) in list(self._waiting.items()):
            if key in errors:
                failed.append((rid, errors[key]))
                del self._waiting[rid]
            elif key in self._cache:
                compiled, checks = self._cache[key]
                matcher = None if compiled is None else xgr.GrammarMatcher(compiled)
                if checks is not None:  # what the grammar could not say, checked as it comes
                    matcher = CheckedMatcher(matcher, checks, self._vocab, self.stop_token_ids)
                if params.thinking_end:  # the grammar applies after the thinking
                    matcher = ThinkingMatcher(
                        matcher,
                        params.thinking_end,
                        params.thinking_start,
                        params.max_thinking_tokens,
                    )
                self.matchers[rid] = matcher
                ready.append(rid)
                del self._waiting[rid]
            elif key in self._too_slow:
                failed.append((rid, self._timeout_message(again=True)))
                del self._waiting[rid]
            elif key not in self._inflight:  # evicted from the cache before it was used
                self._start(key, params)
        return ready, failed

    def _mark_too_slow(self, key: str) -> None:
        self.stats.timeouts += 1
        self._too_slow[key] = None
        self._too_slow.move_to_end(key)
        while len(self._too_slow) > self.cache_size:
            self._too_slow.popitem(last=False)

    # ---- each step --------------------------------------------------------------------

    def has_constrained(self, request_ids: list[str]) -> bool:
        return any(rid in self.matchers for rid in request_ids)

    def fill_bitmask(
        self, request_ids: list[str], drafts: list[list[int]] | None = None
    ) -> torch.Tensor | None:
        """[rows, ceil(vocab / 32)] int32 on the CPU, bit set = token allowed; all bits
        set for unconstrained rows. None if no row is constrained.

        One row per request, or with speculative decoding 1 + len(drafts[i]) rows for
        request i: row j allows what may follow its tokens and drafts[i][:j] (the matcher
        walks the drafts and rolls back)."""
        if not self.has_constrained(request_ids):
            return None
        import xgrammar as xgr

        rows = len(request_ids) + (sum(len(d) for d in drafts) if drafts else 0)
        if self._bitmask is None or self._bitmask.shape[0] < rows:
            self._bitmask = xgr.allocate_token_bitmask(max(rows, 64), self.vocab_size)
        mask = self._bitmask[:rows]
        mask.fill_(-1)
        row = 0
        for i, rid in enumerate(request_ids):
            spec = drafts[i] if drafts else ()
            matcher = self.matchers.get(rid)
            if matcher is not None:
                walked = 0
                for j in range(len(spec) + 1):
                    if matcher.is_terminated():
                        break  # a draft ended the grammar: later rows are never used
                    matcher.fill_next_token_bitmask(mask, row + j)
                    if j == len(spec) or not matcher.accept_token(spec[j]):
                        break  # (a forbidden draft is rejected at its own row)
                    walked += 1
                if walked:
                    matcher.rollback(walked)
            row += len(spec) + 1
        return mask

    def allowed_prefix(self, request_id: str, drafts: list[int], jump_forward: bool) -> list[int]:
        """The longest prefix of `drafts` the request's grammar accepts from its state now
        (speculative decoding drops the rest before verifying). Leaves the state as is.

        With `jump_forward`, the prefix also stops before the first draft after which the
        grammar would force tokens: only a step's last token may be followed by forced
        tokens, and cutting there keeps the output what it is without speculation."""
        matcher = self.matchers.get(request_id)
        if matcher is None:
            return drafts
        n = 0
        for tok in drafts:
            if matcher.is_terminated() or not matcher.accept_token(tok):
                break
            if jump_forward and matcher.find_jump_forward_tokens():
                matcher.rollback(1)
                break
            n += 1
        if n:
            matcher.rollback(n)
        return drafts[:n]

    def advance(self, request_id: str, token_id: int, jump_forward: bool) -> tuple[bool, list[int]]:
        """Accept a sampled token. Returns (grammar finished, forced next tokens).

        The forced tokens are already accepted by the matcher; the caller appends them to
        the request as tokens still to compute."""
        matcher = self.matchers.get(request_id)
        if matcher is None:
            return False, []
        if not matcher.accept_token(token_id):
            # Only possible if the mask was not applied (say, all tokens banned by other
            # settings); end the request rather than continue outside the grammar.
            logger.warning("request %s: token %d rejected by its grammar", request_id, token_id)
            return True, []
        if matcher.is_terminated():
            return True, []
        forced: list[int] = []
        if jump_forward:
            forced = matcher.find_jump_forward_tokens()
            for tok in forced:
                if not matcher.accept_token(tok):  # xgrammar's own tokens; never expected
                    logger.warning("request %s: jump-forward token %d rejected", request_id, tok)
                    return True, []
            self.stats.jump_forward_tokens += len(forced)
        return False, forced

    def remove(self, request_id: str) -> None:
        self.matchers.pop(request_id, None)
        self._waiting.pop(request_id, None)

    def is_waiting(self, request_id: str) -> bool:
        return request_id in self._waiting

    def shutdown(self) -> int:
        """Stop the compile threads that are idle. Returns how many are still inside a
        compile: if any, the process should leave with os._exit (see CompilePool.num_busy)."""
        self._pool.shutdown()
        return self._pool.num_busy

    @property
    def num_abandoned(self) -> int:
        """Compile threads still running a compile given up on (past compile_timeout)."""
        return self._pool.num_abandoned
