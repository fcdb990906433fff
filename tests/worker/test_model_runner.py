"""The model runner alone, driven by hand-built scheduler outputs (no scheduler, no engine):
what it keeps per request, chunked prefill, mixed steps, finishing, and that its greedy
tokens equal transformers' whatever the steps look like."""

from __future__ import annotations

import pytest
import torch
from model_helpers import hf_greedy, make_prompts

from cadence.config import EngineConfig
from cadence.core.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput
from cadence.sampling_params import SamplingParams
from cadence.worker.model_runner import ModelRunner

BS = 4  # tokens per block


@pytest.fixture(scope="module")
def model_path(tiny_model_dir):
    return tiny_model_dir("llama")


@pytest.fixture(scope="module")
def runner(model_path):
    config = EngineConfig.from_kwargs(
        model=model_path,
        device="cpu",
        dtype="float32",
        block_size=BS,
        num_gpu_blocks_override=64,
        max_num_batched_tokens=64,
        attention_backend="torch",
    )
    config.fill_defaults("cpu")
    return ModelRunner(config)


def greedy() -> SamplingParams:
    return SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


class Driver:
    """Plays the scheduler: hands out blocks and builds each step's deltas."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.next_block = 1  # block 0 is never handed out (the zero block)
        self.blocks: dict[str, int] = {}  # request id -> blocks given
        self.computed: dict[str, int] = {}
        self.new: list[NewRequestData] = []

    def _blocks_for(self, rid: str, num_tokens: int) -> list[int]:
        need = -(-num_tokens // BS) - self.blocks.get(rid, 0)
        ids = list(range(self.next_block, self.next_block + max(need, 0)))
        self.next_block += len(ids)
        self.blocks[rid] = self.blocks.get(rid, 0) + len(ids)
        return ids

    def add(self, rid: str, prompt: list[int], first_chunk: int) -> None:
        self.new.append(
            NewRequestData(rid, list(prompt), [], greedy(), self._blocks_for(rid, first_chunk), 0)
        )
        self.computed[rid] = 0

    def step(self, chunks: dict[str, int], finished: list[str] = ()) -> dict[str, int]:
        """Run `chunks[rid]` tokens of each request; returns the tokens sampled."""
        new_ids = {n.request_id for n in self.new}
        sched = SchedulerOutput(new_requests=self.new, finished_ids=list(finished))
        self.new = []
        for rid, n in chunks.items():
            end = self.computed[rid] + n
            if rid not in new_ids:
                sched.cached_requests.append(
                    CachedRequestData(rid, self._blocks_for(rid, end), self.computed[rid], False)
                )
            sched.num_scheduled_tokens[rid] = n
            sched.total_num_scheduled_tokens += n
            self.computed[rid] = end
        return self.runner.execute(sched).sampled


def test_chunked_and_mixed_steps_give_transformers_greedy_tokens(runner, model_path, hf_model):
    hf = hf_model(model_path)
    a, b = make_prompts(runner.vocab_size, [11, 6], seed=3)
    drive = Driver(runner)
    drive.add("a", a, 5)
    assert drive.step({"a": 5}) == {}  # a prefill chunk short of the prompt's end samples nothing
    assert runner.requests["a"].num_computed_tokens == 0  # (counts arrive with the next delta)
    drive.add("b", b, 6)
    out = drive.step({"a": 6, "b": 6})  # a's last chunk and b's whole prompt, one batch
    tokens = {"a": [out["a"]], "b": [out["b"]]}
    for _ in range(5):  # decodes, both at once
        out = drive.step({"a": 1, "b": 1})
        for rid in tokens:
            tokens[rid].append(out[rid])
    assert tokens["a"] == hf_greedy(hf, a, 6)
    assert tokens["b"] == hf_greedy(hf, b, 6)
    # The runner's own copy of each request: prompt + every sampled token.
    assert runner.requests["a"].token_ids == a + tokens["a"]
    drive.step({}, finished=["a", "b"])
    assert "a" not in runner.requests and "b" not in runner.requests


def test_a_finished_request_frees_its_row_for_the_next(runner, model_path, hf_model):
    drive = Driver(runner)
    (p,) = make_prompts(runner.vocab_size, [7], seed=9)
    drive.add("x", p, 7)
    first = drive.step({"x": 7})["x"]
    row = runner.requests["x"].row
    drive.step({}, finished=["x"])
    drive.add("y", p, 7)
    assert drive.step({"y": 7})["y"] == first  # same prompt, same first token
    assert runner.requests["y"].row == row  # the freed row is reused
    drive.step({}, finished=["y"])


def test_an_empty_step_runs_no_forward_pass(runner):
    out = runner.execute_model(SchedulerOutput())
    assert out.sample_ids == [] and out.logits is None and out.forward_start is None


def test_sampling_reads_the_step_logits_in_request_order(runner):
    drive = Driver(runner)
    prompts = make_prompts(runner.vocab_size, [5, 9, 3], seed=1)
    for i, p in enumerate(prompts):
        drive.add(f"r{i}", p, len(p))
    sched = SchedulerOutput(new_requests=drive.new)
    for i, p in enumerate(prompts):
        sched.num_scheduled_tokens[f"r{i}"] = len(p)
        sched.total_num_scheduled_tokens += len(p)
    out = runner.execute_model(sched)
    assert out.sample_ids == ["r0", "r1", "r2"]
    assert out.logits.shape == (3, runner.vocab_size)
    sampled = runner.sample(out)
    assert sampled.sampled == {
        rid: int(row.argmax()) for rid, row in zip(out.sample_ids, out.logits)
    }
    runner.execute(SchedulerOutput(finished_ids=["r0", "r1", "r2"]))
    assert not runner.requests
    assert torch.is_tensor(runner.kv_caches[0])


def test_a_small_model_on_the_cpu_gets_the_pool_it_can_use_not_two_gib(model_path):
    """Without --kv-cache-memory the CPU pool is 2 GiB, or less where twice the scheduler's
    reach (max_num_seqs full-length sequences) is less; an explicit size is kept."""

    def runner_with(**kw) -> ModelRunner:
        config = EngineConfig.from_kwargs(
            model=model_path, device="cpu", dtype="float32", block_size=BS, max_num_seqs=3, **kw
        )
        config.fill_defaults("cpu")
        return ModelRunner(config)

    small = runner_with()
    assert small.num_blocks == 2 * 3 * small.max_blocks_per_seq + 1
    per_block = small._kv_bytes_per_block()
    assert small.num_blocks * per_block < 2 * 2**30
    explicit = runner_with(kv_cache_memory=100 * small.num_blocks * per_block)
    assert explicit.num_blocks == 100 * small.num_blocks
