"""The model runner: owns the model, the KV memory and each request's device-side view.

It receives the scheduler's deltas (new requests in full, cached ones as new block ids and
computed counts), keeps its own copy of every running request's tokens and blocks, builds
one flat batch of tokens per step, runs the forward pass, and samples a token for each
request whose scheduled tokens reach the end of what it knows. Requests that want prompt
logprobs also get the log-softmax at their prompt positions (`prompt_logprobs.py`); an
embedding model's requests pool their prompt's hidden states (`pooling.py`).
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from cadence.attention.base import FP8_KV_DTYPE, AttentionBackend
from cadence.config import EngineConfig
from cadence.core.scheduler_output import SampledTokens, SchedulerOutput
from cadence.distributed.communication import broadcast_
from cadence.distributed.one_shot import ONE_SHOT_MAX_BYTES
from cadence.distributed.parallel_state import enable_one_shot, get_tp
from cadence.layers.sampler import Sampler, SamplerOutput
from cadence.loader.hf_config import eos_token_ids
from cadence.loader.loader import (
    load_hf_config,
    load_model,
    release_freed_memory,
    resolve_dtype,
)
from cadence.loader.model_path import resolve_model_path
from cadence.loader.pooling_config import resolve_pooling
from cadence.lora.manager import LoRAManager
from cadence.platform import pick_device
from cadence.worker import prompt_logprobs
from cadence.worker.backends import make_attention_backend
from cadence.worker.batch_inputs import eager_inputs, layout
from cadence.worker.block_tables import BlockTables
from cadence.worker.cuda_graphs import DecodeGraphs
from cadence.worker.drafter import Drafter, DrafterFactory, TargetView, verify_and_propose
from cadence.worker.image_feeder import ImageFeeder
from cadence.worker.kv_groups import runner_kv_groups
from cadence.worker.kv_tensors import bind_kv_caches, kv_bytes_per_block
from cadence.worker.memory_profile import num_kv_blocks
from cadence.worker.mixed_graphs import MixedGraphs, captures_mixed_steps, mixed_step_tokens
from cadence.worker.pooling import PoolingState
from cadence.worker.prompt_logprobs import PromptLogprobsState, PromptRows
from cadence.worker.sampling_inputs import build_sampling_batch
from cadence.worker.step_state import ModelOutput, PendingSample, RequestState
from cadence.worker.transfer import to_device, to_host_async
from cadence.worker.warmup import warm_up

logger = logging.getLogger(__name__)


class ModelRunner:
    """One rank's runner. With tensor parallelism every rank runs one, on the same deltas
    in the same order (the executor sees to that); each holds its shard of the model and
    of the KV cache (its KV heads), and rank 0 alone samples: the others receive its
    tokens (a broadcast) for the next step's inputs."""

    def __init__(
        self,
        config: EngineConfig,
        model_path: str | None = None,
        drafter_factory: DrafterFactory | None = None,
    ) -> None:
        """`drafter_factory`: speculative decoding's drafter, built from a read-only view
        of this runner's target (the executor passes it; None: no speculation)."""
        self.config = config
        mc = config.model
        tp = get_tp()
        self.is_driver = tp.is_driver
        self.device = tp.device if tp.size > 1 else pick_device(config.device)
        torch.manual_seed(mc.seed)
        if self.device.type == "cpu" and tp.size == 1 and config.parallel.cpu_threads:
            torch.set_num_threads(config.parallel.cpu_threads)  # in-process: never pinned
        self.model_path = model_path or resolve_model_path(mc.model)
        self.hf_config = load_hf_config(self.model_path)
        self.dtype = resolve_dtype(mc.dtype, self.hf_config, self.device)
        model_max = int(getattr(self.hf_config, "max_position_embeddings", 2048))
        if mc.max_model_len is not None and mc.max_model_len > model_max:
            raise ValueError(
                f"max_model_len {mc.max_model_len} exceeds the model's limit {model_max}"
            )
        self.max_model_len = mc.max_model_len or model_max
        self.pooling = resolve_pooling(mc, self.model_path, self.hf_config)
        if self.pooling is not None:  # its one sampled token reads the embedding table
            self.hf_config.tie_word_embeddings = True
        self.backend = self._make_backend(config.attention_backend)
        self.model = load_model(
            self.model_path,
            self.hf_config,
            self.dtype,
            self.device,
            self.backend,
            self.max_model_len,
            mc.load_format,
            mc.seed,
            mc.quantization,
            config.parallel.enable_expert_parallel,
        )
        self.lora = LoRAManager.for_runner(self.model, config, self.dtype, self.device)
        self.image_token_id: int | None = self.model.image_token_id
        self.images = (
            None if self.image_token_id is None else ImageFeeder(self.model, self.device, config)
        )
        if tp.size > 1 and not config.parallel.disable_custom_all_reduce:
            enable_one_shot(ONE_SHOT_MAX_BYTES, self.dtype)
        # The pool's element type: the model's, or e4m3 (--kv-cache-dtype fp8).
        fp8_kv = config.cache.kv_cache_dtype.startswith("fp8")
        self.kv_dtype = FP8_KV_DTYPE if fp8_kv else self.dtype
        self.vocab_size = int(self.hf_config.vocab_size)
        self.eos_token_ids = eos_token_ids(self.model_path, self.hf_config)
        self.block_size = config.cache.block_size
        self.sampler = Sampler()
        self.requests: dict[str, RequestState] = {}
        self._last_tokens: torch.Tensor | None = None  # the last sampled ids, on the device
        self._last_rows: dict[str, int] = {}  # request id -> its row in _last_tokens
        # One spare column: a table row must never be the thing that rejects a request.
        # (Speculation: a draft model writes its guesses' K/V up to k slots further.)
        slots = self.max_model_len + config.num_lookahead_tokens
        self.max_blocks_per_seq = -(-slots // self.block_size) + 1
        self.drafter: Drafter | None = None
        if drafter_factory is not None:  # its draft model counts in the memory profile
            self.drafter = drafter_factory(self._target_view())
        self.kv_groups = runner_kv_groups(self.model.attention_layers(), config, self.drafter)
        self.num_blocks = num_kv_blocks(self, self._kv_bytes_per_block())
        self.allocate_kv_cache()
        # One table per KV group, at the same rows: the first group's picks them.
        self.tables, *self.group_tables = (
            BlockTables(config.scheduler.max_num_seqs, self.max_blocks_per_seq, self.device)
            for _ in range(self.kv_groups.num_groups)
        )
        if self.backend.name == "triton":  # every kernel variant compiles now, not mid-serving
            logger.info("compiled the Triton kernels' variants in %.1f s", warm_up(self))
        self.graphs: DecodeGraphs | None = None
        if self._use_cuda_graphs():
            self.graphs = DecodeGraphs(
                self.model,
                self.backend,
                self.device,
                min(config.max_cuda_graph_batch_size, config.scheduler.max_num_seqs),
                self.max_blocks_per_seq,
                self.block_size,
                self.kv_groups.num_groups,
            )
            seconds = self.graphs.capture()
            logger.info(
                "captured CUDA graphs for %d decode batch sizes (1 to %d) in %.1f s "
                "(%.0f MiB of device memory)",
                len(self.graphs.sizes),
                self.graphs.max_batch,
                seconds,
                self.graphs.memory_taken / 2**20,
            )
        self.mixed_graphs: MixedGraphs | None = None
        # Verify steps (1 + k tokens a request) replay the mixed-step graphs.
        drafting = self.drafter is not None
        if self.graphs is not None and captures_mixed_steps(
            config, self.backend.capabilities, drafting
        ):
            sc = config.scheduler
            self.mixed_graphs = MixedGraphs(
                self.model,
                self.backend,
                self.device,
                mixed_step_tokens(sc, drafting),
                sc.max_num_seqs,
                self.max_blocks_per_seq,
                self.block_size,
                self.kv_groups.num_groups,
            )
            seconds = self.mixed_graphs.capture()
            logger.info(
                "captured CUDA graphs for prefill/mixed steps of %s tokens in %.1f s",
                self.mixed_graphs.sizes,
                seconds,
            )
        if self.drafter is not None and self.device.type == "cuda" and not config.enforce_eager:
            self.drafter.capture_graphs()
        release_freed_memory()  # what loading and profiling freed, back to the OS

    def _make_backend(self, name: str) -> AttentionBackend:
        return make_attention_backend(name, self.device, self.hf_config)

    def _target_view(self) -> TargetView:
        return TargetView(
            self.config,
            self.hf_config,
            self.model,
            self.device,
            self.dtype,
            self.block_size,
            self.max_model_len,
            self.max_blocks_per_seq,
            self.vocab_size,
            self.eos_token_ids,
        )

    def _use_cuda_graphs(self) -> bool:
        if self.device.type != "cuda" or self.config.enforce_eager:
            return False
        if not self.backend.capabilities.decode_graphs:
            logger.info("attention backend %s has no graph-safe decode: eager", self.backend.name)
            return False
        return True

    # ---- memory -----------------------------------------------------------------------

    @property
    def kv_group_windows(self) -> tuple[int | None, ...]:
        """Per KV group, how far back its layers read (None: the whole context): the KV
        manager keeps a block list per group and releases what falls behind a window."""
        return self.kv_groups.windows

    def _kv_bytes_per_block(self) -> int:
        own = kv_bytes_per_block(self.model, self.block_size, self.kv_dtype, self.kv_groups)
        return own + (self.drafter.kv_bytes_per_block() if self.drafter is not None else 0)

    def allocate_kv_cache(self, log: bool = True) -> None:
        self.kv_caches = bind_kv_caches(
            self.model,
            self.num_blocks,
            self.block_size,
            self.kv_dtype,
            self.device,
            self.kv_groups,
        )
        if self.drafter is not None:  # a draft model's own K/V, in the same block ids
            self.kv_caches += self.drafter.allocate_kv_cache(self.num_blocks)
        if not log:
            return
        logger.info(
            "KV cache (%s): %d blocks of %d tokens = %d tokens, %.2f GiB",
            str(self.kv_dtype).removeprefix("torch."),
            self.num_blocks,
            self.block_size,
            self.num_blocks * self.block_size,
            self.num_blocks * self._kv_bytes_per_block() / 2**30,
        )

    # ---- one step ---------------------------------------------------------------------

    def _apply_deltas(self, sched: SchedulerOutput) -> None:
        if self.lora is not None:
            new = [(n.request_id, n.lora) for n in sched.new_requests]
            self.lora.follow(new, sched.finished_ids, sched.lora_loads)
        for rid in sched.finished_ids:
            st = self.requests.pop(rid, None)
            if st is not None:
                self.tables.remove(st.row)
        group_tables = self.group_tables
        for new in sched.new_requests:
            params, num_prompt = new.sampling_params, len(new.prompt_token_ids)
            gen = None
            if params.seed is not None:
                gen = torch.Generator(device=self.device).manual_seed(params.seed)
            lp = params.prompt_logprobs
            pool = self.pooling
            self.requests[new.request_id] = RequestState(
                new.prompt_token_ids + new.output_token_ids,
                num_prompt,
                params,
                gen,
                row := self.tables.add(new.block_ids),
                new.num_computed_tokens,
                prompt_lp=None if lp is None else PromptLogprobsState(lp),
                pool=None if pool is None else PoolingState(pool.pooling_type, num_prompt),
                images=new.images,
            )
            for table, ids in zip(group_tables, new.group_block_ids, strict=True):
                table.put(row, ids)
        for cached in sched.cached_requests:
            st = self.requests[cached.request_id]
            tables = zip(
                [self.tables, *group_tables],
                [cached.new_block_ids, *cached.new_group_block_ids],
                strict=True,
            )
            for table, ids in tables:
                if cached.resumed:
                    table.replace(st.row, ids)
                else:
                    table.extend(st.row, ids)
            st.num_computed_tokens = cached.num_computed_tokens
            st.token_ids.extend(cached.new_token_ids)

    def execute(self, sched: SchedulerOutput) -> SampledTokens:
        """Forward pass and sampling, with no grammar masks (tests and simple callers)."""
        return self.sample(self.execute_model(sched))

    @torch.inference_mode()
    def execute_model(self, sched: SchedulerOutput) -> ModelOutput:
        """Apply the step's deltas and launch the forward pass; returns the logits of the
        requests that sample this step, in `sample_ids` order. On a GPU this returns as
        soon as the kernels are queued, so the caller can fill grammar masks meanwhile."""
        self._apply_deltas(sched)
        if sched.is_empty:
            return ModelOutput([], None)
        input_ids: list[int] = []
        rows: list[int] = []  # each request's BlockTables row
        starts: list[int] = []  # its first scheduled position (tokens already computed)
        query_lens: list[int] = []
        sample_ids: list[str] = []
        sample_rows: list[int] = []  # query tokens whose logits are sampled (1 + drafts each)
        drafts: list[list[int]] = []  # per sampling request: the draft tokens it verifies
        fill_rows: list[int] = []  # query tokens whose id is still on the device ...
        fill_from: list[int] = []  # ... at this row of the last sampled tokens
        prompt_rows = PromptRows()  # positions whose prompt logprobs are wanted
        pools: list[tuple[PoolingState, int, int, int]] = []  # (state, first row, start, end)
        for rid, n in sched.num_scheduled_tokens.items():
            st = self.requests[rid]
            spec = sched.spec_token_ids.get(rid, [])
            start = st.num_computed_tokens
            end = start + n - len(spec)  # the known tokens' end; the drafts follow
            known = len(st.token_ids)
            if st.prompt_lp is not None:
                st.prompt_lp.plan(
                    st.token_ids, st.num_prompt_tokens, start, end, len(input_ids), prompt_rows
                )
            if st.pool is not None:
                pools.append((st.pool, len(input_ids), start, end))
            if st.images:
                self.images.plan(st, start, start + n, len(input_ids))
            input_ids.extend(st.token_ids[start:end])
            if end > known:  # async scheduling: the token sampled last step, not read yet
                assert end == known + 1 == known + st.num_pending, (rid, end, known)
                fill_rows.append(len(input_ids))
                fill_from.append(self._last_rows[rid])
                input_ids.append(0)
            input_ids.extend(spec)
            rows.append(st.row)
            starts.append(start)
            query_lens.append(n)
            if end == known + st.num_pending:
                sample_ids.append(rid)
                sample_rows.extend(range(len(input_ids) - len(spec) - 1, len(input_ids)))
                drafts.append(spec)

        if self.lora is not None:  # which tokens read which adapter slot
            self.lora.plan(list(sched.num_scheduled_tokens), query_lens)
        dev, bs = self.device, self.block_size
        num_reqs, num_tokens = len(rows), len(input_ids)
        lay = layout(rows, starts, query_lens, self.tables, bs, self.group_tables)
        rows_np, qlens_np, slots = lay.rows, lay.query_lens, lay.slots
        seq_lens_np = lay.seq_lens
        width = int(self.tables.num_blocks[rows_np].max())
        for table in (self.tables, *self.group_tables):
            table.sync()  # this step's new blocks, on the device before the gather
        graph_size = mixed_size = None
        images = self.images.take(lay) if self.images is not None else None  # (M-RoPE: moves
        # lay.positions; a step of image tokens runs eager)
        if self.graphs is not None and num_tokens == num_reqs and images is None:  # decodes
            graph_size = self.graphs.size_for(num_reqs)
        if graph_size is None and self.mixed_graphs is not None and images is None:
            mixed_size = self.mixed_graphs.size_for(qlens_np, seq_lens_np)
        fill = None
        if fill_rows:
            fill_d = to_device(torch.tensor([fill_rows, fill_from], dtype=torch.int64), dev)
            fill = (fill_d[0], self._last_tokens[fill_d[1]])
        if graph_size is not None:
            token_inputs = np.stack(
                [np.array(input_ids), lay.positions, slots, seq_lens_np, *lay.group_slots, rows_np]
            )
            forward_start = time.perf_counter()
            hidden = self.graphs.run(
                graph_size, token_inputs, self.tables, width, fill, self.group_tables
            )
        elif mixed_size is not None:
            tokens = np.stack([np.array(input_ids), lay.positions, slots, *lay.group_slots])
            forward_start = time.perf_counter()
            hidden = self.mixed_graphs.run(
                mixed_size,
                tokens,
                qlens_np,
                seq_lens_np,
                rows_np,
                self.tables,
                width,
                fill,
                self.group_tables,
            )
        else:
            ids_d, pos_d, meta = eager_inputs(
                lay, input_ids, self.tables, self.backend, dev, bs, self.group_tables
            )
            if fill is not None:
                ids_d[fill[0]] = fill[1]
            forward_start = time.perf_counter()
            hidden = self.model(ids_d, pos_d, meta, images)
        if self.drafter is not None:  # what the proposer reads after verification
            self.drafter.record_step(list(sched.num_scheduled_tokens), lay, hidden, self.tables)
        for pool, row, start, end in pools:
            pool.fold(hidden, row, start, end)
        if prompt_rows.rows:
            max_rows = min(self.config.scheduler.max_num_seqs, 128)
            prompt_logprobs.compute(self.model, hidden, prompt_rows, max_rows)
        if not sample_ids:
            return ModelOutput([], None, forward_start=forward_start)
        if len(sample_rows) == num_tokens:  # every token samples (decodes): no gather
            logits = self.model.compute_logits(hidden)
        else:
            sample_rows_d = to_device(torch.tensor(sample_rows, dtype=torch.int64), dev)
            logits = self.model.compute_logits(hidden[sample_rows_d])
        drafts_out = drafts if self.drafter is not None else None
        return ModelOutput(sample_ids, logits, drafts_out, forward_start)

    @torch.inference_mode()
    def sample(
        self, model_out: ModelOutput, grammar_bitmask: torch.Tensor | None = None
    ) -> SampledTokens:
        """Sample one token per row of `model_out` and read them back. `grammar_bitmask`
        ([rows, ceil(V/32)] int32 on the CPU, a set bit allows a token) constrains
        structured-output rows (with speculative decoding, one row per logits row).

        With speculative decoding this verifies the drafts (rejection sampling), appends the
        accepted tokens and proposes the next drafts: a synchronous step."""
        if self.drafter is not None:
            return verify_and_propose(self.drafter, model_out, grammar_bitmask, self.requests)
        return self.resolve(self.sample_async(model_out, grammar_bitmask))

    @torch.inference_mode()
    def sample_async(
        self, model_out: ModelOutput, grammar_bitmask: torch.Tensor | None = None
    ) -> PendingSample | None:
        """Launch sampling; the ids stay on the device (the next step's inputs can take
        them from there) and start their copy to the host without waiting for it."""
        rids, logits = model_out.sample_ids, model_out.logits
        if not rids:
            return None
        if self.is_driver:
            batch = build_sampling_batch(
                [self.requests[r] for r in rids], self.device, self.vocab_size, self.eos_token_ids
            )
            if grammar_bitmask is not None:
                # (pin_memory copies it, so the manager may refill its buffer next step)
                batch.allowed_bitmask = to_device(grammar_bitmask, self.device)
            out = self.sampler(logits, batch)
            broadcast_(out.token_ids)  # the other ranks' next inputs (tensor parallelism)
        else:  # rank 0 samples; this rank takes its tokens
            tokens = torch.empty(len(rids), dtype=torch.int64, device=self.device)
            out = SamplerOutput(broadcast_(tokens))
        self._last_tokens = out.token_ids
        self._last_rows = {rid: i for i, rid in enumerate(rids)}
        for rid in rids:
            self.requests[rid].num_pending += 1
        ready = None
        host = out
        if self.device.type == "cuda":
            # Everything resolve() reads, copied to pinned memory without waiting; the
            # event says when it has landed (before the next step's forward finishes).
            host = SamplerOutput(
                *(
                    to_host_async(t)
                    for t in (out.token_ids, out.logprobs, out.top_ids, out.top_logprobs)
                )
            )
            ready = torch.cuda.Event()
            ready.record()
        return PendingSample(rids, [self.requests[rid] for rid in rids], host, ready)

    def resolve(self, pending: PendingSample | None) -> SampledTokens:
        """Wait for a launched sampling and append its ids: the step's one device-to-host
        copy. Requests that finished or were aborted meanwhile are skipped."""
        result = SampledTokens()
        if pending is None:
            return result
        if pending.ready is not None:
            pending.ready.synchronize()
        out = pending.out
        tokens = out.token_ids.tolist()
        lps = out.logprobs.tolist() if out.logprobs is not None else None
        top_ids = out.top_ids.tolist() if out.top_ids is not None else None
        top_lps = out.top_logprobs.tolist() if out.top_logprobs is not None else None
        for i, rid in enumerate(pending.sample_ids):
            st = self.requests.get(rid)
            if st is None or st is not pending.states[i]:
                continue  # finished or aborted meanwhile (and its id maybe reused)
            st.num_pending -= 1
            st.token_ids.append(tokens[i])
            result.sampled[rid] = tokens[i]
            k = st.params.logprobs
            if k is not None and lps is not None:
                top = list(zip(top_ids[i][:k], top_lps[i][:k])) if k > 0 else []
                result.logprobs[rid] = [(lps[i], top)]
            if st.prompt_lp is not None and not st.prompt_lp.sent:
                # Its first token: every prompt position has been computed by now.
                result.prompt_logprobs[rid] = st.prompt_lp.take()
            if st.pool is not None and not st.pool.sent:
                result.embeddings[rid] = st.pool.take()
        return result
