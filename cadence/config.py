"""The engine's configuration: one tree of frozen-ish dataclasses, validated in one place.

EngineConfig
  model:     ModelConfig      what to load and in which dtype
  cache:     CacheConfig      block size, pool size, prefix caching
  scheduler: SchedulerConfig  token budget, sequence cap, context length
  structured: StructuredOutputsConfig  grammar compile threads, cache, jump-forward
  parallel:  ParallelConfig   tensor parallelism, which executor runs the workers
  speculative: SpeculativeConfig | None   speculative decoding (`--speculative-config`)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
from dataclasses import dataclass, field

from cadence.config_speculative import SpeculativeConfig
from cadence.config_values import parse_size

logger = logging.getLogger(__name__)


@dataclass
class ModelConfig:
    model: str | None = None  # a checkpoint folder or a .gguf file; None: SmolLM2
    tokenizer: str | None = None  # defaults to the model's
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    load_format: str = "auto"  # auto | dummy
    # Weight format: auto (a .gguf file keeps its blocks packed unless --dtype float32; a
    # checkpoint's own quantization_config), none (plain weights in --dtype), fp8 (W8A8:
    # bf16 weights quantized at load, or an FP8 checkpoint), gguf (the file's blocks).
    quantization: str = "auto"  # auto | none | fp8 | gguf
    seed: int = 0  # seed of the engine's random draws and of dummy weights
    max_model_len: int | None = None  # None: the model's own limit
    skip_tokenizer_init: bool = False  # load no tokenizer (prompts must be token ids)
    trust_remote_code: bool = False  # accepted for vLLM compatibility; no remote code runs
    # What the model is served for: generate (text), pooling (embeddings, /v1/embeddings),
    # auto (pooling for a headless checkpoint, architectures *Model, else generate).
    runner: str = "auto"  # auto | generate | pooling (embeddings; auto: for XxxModel checkpoints)
    # Pooling models: '{"pooling_type": "LAST" | "MEAN" | "CLS", "normalize": true}' over the
    # checkpoint's sentence-transformers files (default without them: LAST, normalized).
    pooler_config: str | None = None  # JSON: {"pooling_type": "MEAN", "normalize": false}
    # Vision-language models: the most images one prompt may carry (default 16).
    limit_mm_per_prompt: str | None = None  # JSON: {"image": 4} (LLM(...) takes a dict too)

    def images_per_prompt(self) -> int:
        """The most images a prompt may carry, from limit_mm_per_prompt ('{"image": 4}')."""
        limits = self.limit_mm_per_prompt
        try:
            limits = json.loads(limits) if isinstance(limits, str) else limits or {}
            count = limits.get("image", 16) if set(limits) <= {"image"} else None
        except (ValueError, AttributeError, TypeError):
            count = None
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f'limit_mm_per_prompt must be like {{"image": 4}}: {limits!r}')
        return count


RUNNERS = ("auto", "generate", "pooling")


@dataclass
class PoolingSpec:
    """How an embedding model turns a prompt's final hidden states into one vector."""

    pooling_type: str = "LAST"  # LAST (the last token's), MEAN (over the prompt), CLS (the first)
    normalize: bool = True  # L2-normalize the vector (after any Matryoshka truncation)
    hidden_size: int = 0  # the vector's full length
    # Matryoshka: the lengths a request's `dimensions` may ask for (None: only the full
    # one, unless `any_dimensions`: any length up to hidden_size).
    matryoshka_dimensions: list[int] | None = None
    any_dimensions: bool = False


@dataclass
class CacheConfig:
    block_size: int = 16  # tokens per KV block
    kv_cache_memory: int | None = None  # bytes for the KV pool (CPU); None: a default
    gpu_memory_utilization: float = 0.9  # fraction of GPU memory for weights + KV pool
    num_gpu_blocks_override: int | None = None  # KV pool size in blocks (tests, any device)
    enable_prefix_caching: bool = True
    prefix_cache: str = "hash"  # hash (vLLM's block hash table) | radix (SGLang's tree)
    radix_eviction_policy: str = "lru"  # radix cache: which leaf goes first, lru | lfu
    # auto: the model's dtype. fp8 (= fp8_e4m3): e4m3 with a per-layer scale (the
    # checkpoint's k_scale / v_scale, else 1.0); a block holds the same tokens in half the bytes.
    kv_cache_dtype: str = "auto"  # auto | fp8 | fp8_e4m3


# The order waiting requests are admitted in (cadence/core/policies.py implements them).
SCHEDULING_POLICIES = ("fcfs", "priority", "lpm", "dfs-weight")


@dataclass
class SchedulerConfig:
    max_num_batched_tokens: int | None = None  # tokens per step; None: 8192 on CUDA, 512 on CPU
    # While requests decode, each of their next tokens waits for the whole step: prompt
    # tokens beyond this many would stretch it to a prefill's length (a stall in every
    # stream). 0: no bound but max_num_batched_tokens. None: when `cadence serve` runs on a
    # GPU, as many as keep a step inside the largest mixed-step graph beside max_num_seqs
    # decodes (2,048 - 256 = 1,792 by default); offline, 0 (a batch wants throughput).
    max_prefill_tokens_while_decoding: int | None = (
        None  # prompt tokens a step adds to decodes (0: any; none: what fits the largest mixed-step graph beside max_num_seqs decodes when serving on a GPU, 1792 for 256, else 0)
    )
    # The same bound from measured step times (cadence/core/step_pacer.py): a step beside
    # decodes takes at most this many times a decode-only step. 0: off. None: 2.0 where the
    # static bound is on by default (a server replaying mixed steps in GPU graphs), else off.
    mixed_step_factor: float | None = (
        None  # a step with prompt tokens beside decodes takes at most this many decode-only steps' time (0: off; none: 2.0 serving on a GPU)
    )
    max_num_seqs: int = 256  # sequences in one step at most
    max_model_len: int = 2048  # filled in from the model at start-up
    scheduling_policy: str = "fcfs"  # fcfs | priority | lpm | dfs-weight
    scheduling_aging_steps: int = 200  # cache-aware policies: steps before a request goes first
    async_scheduling: bool | None = None  # schedule step N+1 while step N runs; auto: on CUDA


# Tokens per step when not given. On an H200, 8,192 gave 18 % more output tokens/s than
# 2,048 on 256 prompts of 1,024 tokens (benchmarks/RESULTS.md). On a CPU a step of 2,048
# prompt tokens takes over a second, during which every running request waits for its
# next token; 512 keeps steps near a quarter of that at the same prefill rate (issue 18).
DEFAULT_BATCHED_TOKENS = {"cuda": 8192, "cpu": 512}

# The largest prefill/mixed step captured in a CUDA graph (cadence/worker/mixed_graphs.py).
MIXED_GRAPH_TOKENS = 2048

# A served stream's gap when prompt tokens join its step, in decode-only steps (the pacer's
# cap, within the static bound above). Issue 37's target is an ITL p99 within 3x the TPOT
# p50, and a client's gap is the engine's step plus the API side's share. On the H200
# (Llama-8B shape, C=256, 2 API processes; RESULTS, issue 37, one lease): factor 2.5 gave
# ITL p99 3.02x and 3.13x TPOT p50 in two runs, 2.0 gave 2.64x, the static bound alone
# 4.62x; output tok/s 19,957 / 20,759, 20,331 and 21,633 (every one above the offline
# harness's 18,335).
DEFAULT_MIXED_STEP_FACTOR = 2.0


@dataclass
class StructuredOutputsConfig:
    jump_forward: bool = True  # append tokens a grammar forces without sampling them
    grammar_cache_size: int = 256  # compiled grammars kept (LRU)
    grammar_compile_threads: int = 2  # worker threads compiling grammars off the loop
    grammar_compile_timeout: float = 30.0  # seconds a grammar may compile (then: a 400)


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1  # GPUs (or CPU processes) one model is split across
    # uniproc: in this process (1 rank); mp: one process per rank on this host; ray: Ray
    # actors placed by a placement group (several hosts). auto: uniproc for 1, else mp.
    distributed_executor_backend: str = "auto"  # auto | uniproc | mp | ray
    # Small all-reduces (decode steps) go through a one-shot kernel over peer-mapped
    # buffers where that measured faster than NCCL; this sends every one to NCCL.
    disable_custom_all_reduce: bool = False  # every all-reduce through NCCL / gloo
    # Mixtures of experts under tensor parallelism: each rank holds experts / tp whole
    # experts instead of every expert's intermediate / tp columns.
    enable_expert_parallel: bool = False  # split MoE experts whole across the TP ranks
    # Internal: the port rank 0 listens on for torch.distributed's rendezvous (0: any).
    distributed_init_port: int = 0  # the TCP port of torch.distributed's rendezvous
    # A CPU engine's intra-op threads (None: one per core it may run on) and, in the
    # engine process of `cadence serve`, each pinned to one core when the pool takes every
    # core of the process's affinity mask (cadence/worker/cpu_threads.py).
    cpu_threads: int | None = None  # intra-op threads of a CPU engine (none: one per core)
    cpu_bind_threads: bool = True  # pin a served CPU engine's threads, one to a core


@dataclass
class LoRAConfig:
    enable_lora: bool = False  # serve PEFT LoRA adapters over the base model
    max_loras: int = 4  # adapters one step can mix (the slots their weights occupy)
    max_lora_rank: int = 16  # the largest adapter rank accepted (slots are this wide)
    max_cpu_loras: int | None = None  # adapters kept in CPU memory (none: max_loras)

    def validate(self) -> None:
        if self.max_loras < 1:
            raise ValueError(f"max_loras must be positive, got {self.max_loras}")
        if not 1 <= self.max_lora_rank <= 512:
            raise ValueError(f"max_lora_rank must be in [1, 512], got {self.max_lora_rank}")
        if self.max_cpu_loras is None:
            self.max_cpu_loras = self.max_loras
        if self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be at least max_loras "
                f"({self.max_loras})"
            )


QUANTIZATIONS = ("auto", "none", "fp8", "gguf")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
KV_SECRET_ENV = "CADENCE_KV_TRANSFER_SECRET"
MIN_SECRET_CHARS = 16
# A K/V server's address (a prefill engine's; a decode engine connects to it).
KV_ADDR = re.compile(r"tcp://(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}")


@dataclass
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    structured: StructuredOutputsConfig = field(default_factory=StructuredOutputsConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    speculative: SpeculativeConfig | None = None  # set by --speculative-config
    device: str = "auto"  # auto | cpu | cuda
    attention_backend: str = "auto"  # auto (triton on CUDA, cpu on CPU) | torch | triton | cpu
    enforce_eager: bool = False  # no CUDA graphs: run every step eagerly
    # Largest decode batch captured in a CUDA graph (and never above max_num_seqs, 256 by
    # default): a server run with --max-num-seqs 512 decodes 512 at once in graphs too.
    max_cuda_graph_batch_size: int = 512
    # Halves a short prompt's time to first token and keeps steps that mix prompt chunks with
    # decodes short under load (an eager one waited 25-35 ms on launches on a busy H200 host),
    # but measured 3 % slower batch-1 decode steps (benchmarks/RESULTS.md, issue 13). None: on
    # when `cadence serve` runs on a GPU, off offline.
    cuda_graph_prefill: bool | None = (
        None  # CUDA graphs of prefill/mixed steps up to 2048 tokens (auto: on when serving on a GPU)
    )
    # Set by `cadence serve`: defaults that favour streams' inter-token latency over an
    # offline batch's throughput (the two fields above).
    serving: bool = False  # (internal) this engine answers a server's streams
    check_kv_integrity: bool = False  # after every step (tests)
    step_timeline_size: int = 1024  # steps whose phase times the engine keeps (0: none)
    kv_role: str | None = None  # disaggregated serving: prefill | decode (none: both here)
    # how K/V moves: tcp (any hosts) | shm (same host) | cuda_ipc (same host, GPU to GPU)
    kv_connector: str = "tcp"
    kv_transfer_host: str = "127.0.0.1"  # prefill role: where its K/V server listens
    kv_transfer_port: int = 0  # prefill role: its port (0: a free one)
    # The deployment's shared secret, the same on every engine and the router: it
    # authenticates the K/V channel and the router's kv_transfer_params. The environment
    # variable is the better place: a flag's value shows in the process list.
    kv_transfer_secret: str | None = (
        None  # with --kv-role: the deployment's secret (better: $CADENCE_KV_TRANSFER_SECRET)
    )
    kv_prefill_addrs: str | None = (
        None  # decode role: the prefill engines' K/V addresses it may load from, comma-separated tcp://HOST:PORT (none: any that holds the secret)
    )
    profile_dir: str | None = None  # where POST /start_profile writes torch.profiler traces
    profile_max_seconds: float = 60.0  # a profile stops (and is written) after this long
    profile_max_traces: int = 10  # traces kept in --profile-dir (the oldest are deleted)

    def validate(self) -> None:
        c, s = self.cache, self.scheduler
        if self.model.runner not in RUNNERS:
            raise ValueError(
                f"runner must be one of {', '.join(RUNNERS)}, got {self.model.runner!r}"
            )
        if c.block_size < 1:
            raise ValueError(f"block_size must be positive, got {c.block_size}")
        if s.max_num_batched_tokens is not None and s.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be positive, got {s.max_num_batched_tokens}"
            )
        cap = s.max_prefill_tokens_while_decoding
        if cap is not None and cap < 0:
            raise ValueError(f"max_prefill_tokens_while_decoding must be >= 0, got {cap}")
        factor = s.mixed_step_factor
        if factor is not None and factor != 0 and not 1 < factor < math.inf:  # (NaN too)
            raise ValueError(f"mixed_step_factor must be > 1 and finite, or 0: off; got {factor}")
        if self.parallel.cpu_threads is not None and self.parallel.cpu_threads < 1:
            raise ValueError(f"cpu_threads must be positive, got {self.parallel.cpu_threads}")
        if self.kv_role not in (None, "prefill", "decode"):
            raise ValueError(f"kv_role must be prefill or decode, got {self.kv_role!r}")
        if self.kv_connector not in ("tcp", "shm", "cuda_ipc"):
            raise ValueError(
                f"kv_connector must be tcp, shm or cuda_ipc, got {self.kv_connector!r}"
            )
        if self.kv_connector == "cuda_ipc" and self.device == "cpu":
            raise ValueError("--kv-connector cuda_ipc needs a GPU: use shm or tcp on the CPU")
        if self.kv_role is not None:
            if self.kv_transfer_secret is None:
                self.kv_transfer_secret = os.environ.get(KV_SECRET_ENV) or None
            if len(self.kv_transfer_secret or "") < MIN_SECRET_CHARS:
                raise ValueError(
                    f"--kv-role needs the deployment's secret, of {MIN_SECRET_CHARS} characters "
                    f"or more (e.g. `openssl rand -hex 32`): ${KV_SECRET_ENV} or "
                    "--kv-transfer-secret"
                )
        for addr in (self.kv_prefill_addrs or "").split(","):
            if addr.strip() and not KV_ADDR.fullmatch(addr.strip()):
                raise ValueError(f"--kv-prefill-addrs: {addr.strip()!r} is not tcp://HOST:PORT")
        if self.profile_max_seconds <= 0 or self.profile_max_traces < 1:
            raise ValueError("profile_max_seconds and profile_max_traces must be positive")
        if self.kv_role and self.parallel.tensor_parallel_size > 1:
            raise ValueError("--kv-role (disaggregated serving) needs tensor_parallel_size 1")
        if self.step_timeline_size < 0:
            raise ValueError(f"step_timeline_size must be >= 0, got {self.step_timeline_size}")
        if s.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be positive, got {s.max_num_seqs}")
        if c.num_gpu_blocks_override is not None and c.num_gpu_blocks_override < 1:
            raise ValueError("num_gpu_blocks_override must be positive")
        if not 0.0 < c.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.model.dtype not in (
            "auto",
            "float32",
            "bfloat16",
            "float16",
            "half",
            "float",
            "bf16",
            "fp16",
            "fp32",
        ):
            raise ValueError(f"unknown dtype {self.model.dtype!r}")
        self.model.images_per_prompt()  # (raises on a malformed limit)
        if c.prefix_cache not in ("hash", "radix"):
            raise ValueError(f"prefix_cache must be hash or radix, got {c.prefix_cache!r}")
        if c.radix_eviction_policy not in ("lru", "lfu"):
            raise ValueError(
                f"radix_eviction_policy must be lru or lfu, got {c.radix_eviction_policy!r}"
            )
        if s.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"unknown scheduling policy {s.scheduling_policy!r}; "
                f"choose one of {', '.join(SCHEDULING_POLICIES)}"
            )
        if s.scheduling_aging_steps < 1:
            raise ValueError("scheduling_aging_steps must be positive")
        if self.attention_backend not in ("auto", "torch", "triton", "cpu"):
            raise ValueError(f"unknown attention backend {self.attention_backend!r}")
        if self.max_cuda_graph_batch_size < 1:
            raise ValueError("max_cuda_graph_batch_size must be positive")
        st = self.structured
        if st.grammar_cache_size < 1 or st.grammar_compile_threads < 1:
            raise ValueError("grammar_cache_size and grammar_compile_threads must be positive")
        if not st.grammar_compile_timeout > 0:
            raise ValueError("grammar_compile_timeout must be positive")
        p = self.parallel
        if p.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {p.tensor_parallel_size}")
        if p.distributed_executor_backend not in ("auto", "uniproc", "mp", "ray"):
            raise ValueError(
                "distributed_executor_backend must be auto, uniproc, mp or ray, got "
                f"{p.distributed_executor_backend!r}"
            )
        if p.distributed_executor_backend == "uniproc" and p.tensor_parallel_size > 1:
            raise ValueError("the uniproc executor runs one rank: use mp or ray for TP > 1")
        if self.model.load_format not in ("auto", "dummy", "safetensors", "gguf"):
            raise ValueError(f"unknown load_format {self.model.load_format!r}")
        if self.model.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"unknown quantization {self.model.quantization!r}: "
                f"one of {', '.join(QUANTIZATIONS)}"
            )
        if c.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"unknown kv_cache_dtype {c.kv_cache_dtype!r}: one of {', '.join(KV_CACHE_DTYPES)}"
            )
        if self.model.quantization == "gguf" and p.tensor_parallel_size > 1:
            raise ValueError("GGUF weights kept quantized do not split over ranks: use TP 1")
        self.lora.validate()
        if self.lora.enable_lora and (
            self.speculative is not None or c.prefix_cache != "hash" or self.kv_role
        ):
            raise ValueError(
                "--enable-lora runs without speculative decoding, without --kv-role and with "
                "the hash prefix cache (--prefix-cache hash) for now"
            )
        if self.speculative is not None:
            self.speculative.validate()
            if p.tensor_parallel_size > 1:
                raise ValueError(
                    "speculative decoding does not run under tensor parallelism yet: "
                    "use --tensor-parallel-size 1"
                )

    def fill_defaults(self, device_type: str) -> None:
        """Settle what depends on the device ("cuda", "cpu"), once, before the engine starts."""
        sc = self.scheduler
        if sc.max_num_batched_tokens is None:
            sc.max_num_batched_tokens = DEFAULT_BATCHED_TOKENS.get(device_type, 2048)
        if sc.async_scheduling is None:
            # On a GPU the host prepares step N+1 while the device runs step N (H200,
            # Llama-8B: +5 % at batch 1, +13 % at batch 64). A CPU computes the forward on
            # the calling thread, so there is nothing to overlap.
            sc.async_scheduling = device_type == "cuda"
        # A server's streams wait for every step that carries prompt tokens. On the H200
        # (Llama-8B, C=256, 128 -> 256; RESULTS, issue 37) mixed steps in graphs with at most
        # 2,048 prompt tokens beside the decodes (graphs captured to 2,560 tokens there) took
        # ITL p99 from 129 to 62 ms at the same output tok/s (19,374 against 19,245); the
        # default bound keeps such a step inside the largest graph captured here (with up to
        # 1,536 sequences; drafts to verify may still go past it). Without those graphs
        # (--enforce-eager, --no-cuda-graph-prefill) a bound alone bought nothing measurable
        # (eager mixed steps wait 25-35 ms on launches whatever their size), so none is set.
        # An offline batch keeps the whole budget: nobody streams, prompts dominate its time.
        streams_on_gpu = self.serving and device_type == "cuda"
        if self.cuda_graph_prefill is None:
            self.cuda_graph_prefill = streams_on_gpu
        graphed = streams_on_gpu and self.cuda_graph_prefill and not self.enforce_eager
        bound_by_default = sc.max_prefill_tokens_while_decoding is None
        if bound_by_default:
            fits_graph = max(512, MIXED_GRAPH_TOKENS - sc.max_num_seqs)
            sc.max_prefill_tokens_while_decoding = fits_graph if graphed else 0
        # (not where the user set the static bound, 0 included; nor on eager steps, whose
        # launches would read as the price of prompt tokens)
        if sc.mixed_step_factor is None:
            paced = graphed and bound_by_default
            sc.mixed_step_factor = DEFAULT_MIXED_STEP_FACTOR if paced else 0
        if self.speculative is not None and sc.async_scheduling:
            # The next step's drafts depend on how many of this step's were accepted.
            logger.info("speculative decoding runs synchronous steps (no async scheduling)")
            sc.async_scheduling = False

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots a request needs past its scheduled tokens: where a draft proposer writes
        the K/V of the tokens it guesses (0 without speculation)."""
        return self.speculative.num_speculative_tokens if self.speculative else 0

    @classmethod
    def from_kwargs(cls, **kwargs) -> EngineConfig:
        """Build from flat keyword arguments (as `LLM(...)` and the CLI take them)."""
        parts = {
            "model": ModelConfig,
            "cache": CacheConfig,
            "scheduler": SchedulerConfig,
            "structured": StructuredOutputsConfig,
            "parallel": ParallelConfig,
            "lora": LoRAConfig,
        }
        sub: dict[str, dict] = {k: {} for k in parts}
        top: dict = {}
        top_names = {f.name for f in dataclasses.fields(cls)} - set(parts)
        for key, value in kwargs.items():
            if key in ("speculative_config", "speculative"):
                top["speculative"] = SpeculativeConfig.parse(value)
                continue
            if key == "max_model_len":
                sub["model"][key] = value
                continue
            if key == "kv_cache_memory" and value is not None:
                value = parse_size(value)  # LLM(kv_cache_memory="512MiB") as the flag reads
            for part, klass in parts.items():
                if key in {f.name for f in dataclasses.fields(klass)}:
                    sub[part][key] = value
                    break
            else:
                if key in top_names:
                    top[key] = value
                else:
                    raise TypeError(f"unknown engine argument {key!r}")
        cfg = cls(**{k: parts[k](**v) for k, v in sub.items()}, **top)
        cfg.validate()
        return cfg
