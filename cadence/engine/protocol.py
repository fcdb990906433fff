"""Messages between the API server and the engine core process (msgspec over ZMQ).

Token ids travel, text does not. Frames on the input socket are (kind, payload):

    ADD       EngineCoreRequest          queue one sequence
    ABORT     list[str]                  request ids to drop (hang-ups, stop strings)
    CALL      EngineCall                 a question for the core (step timeline, request
                                         table, profiler): answered by one EngineCallReply
    SHUTDOWN  None                       leave the loop

On an output socket every frame is one EngineCoreOutputs (a step's token updates, any
per-request errors, and the scheduler's stats) or one EngineCallReply. While the core has
unfinished work it sends one at least every HEARTBEAT_INTERVAL_S, updates or not: the API
server takes a long silence with requests in flight for a wedged engine.

Several API processes (--api-server-count) each have an input and an output socket; a
request or call names its process (client_index) and the engine answers there (fanout.py).
"""

from __future__ import annotations

import msgspec

from cadence.config import PoolingSpec
from cadence.core.scheduler_output import RequestUpdate
from cadence.lora_request import LoRARequest
from cadence.multimodal.inputs import ImageInput
from cadence.sampling_params import SamplingParams

ADD = b"add"
ABORT = b"abort"
SHUTDOWN = b"shutdown"
CALL = b"call"

HEARTBEAT_INTERVAL_S = 1.0  # the core's longest silence between steps while it has work


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True):
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float
    priority: int = 0
    lora: LoRARequest | None = None  # the adapter it runs with (None: the base model)
    client_index: int = 0  # the API process that sent it: its outputs go there (fanout.py)
    images: list[ImageInput] = []  # its images' placeholder spans and pixels, in order


class EngineStats(msgspec.Struct, array_like=True):
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    num_preemptions: int = 0  # cumulative
    prefix_queries: int = 0  # cumulative tokens
    prefix_hits: int = 0  # cumulative tokens
    num_blocks: int = 0
    prefix_requests: int = 0  # cumulative
    prefix_hit_requests: int = 0  # cumulative
    prefix_evictions: int = 0  # cumulative blocks
    structured_requests: int = 0  # cumulative, below: grammar manager's
    grammar_compiles: int = 0
    grammar_cache_hits: int = 0
    jump_forward_tokens: int = 0
    # Speculative decoding, cumulative (see SpecDecodeStats)
    spec_verifications: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_per_position: list[int] = []
    spec_acceptance_lengths: list[int] = []  # [n]: verifications that yielded n tokens
    num_preempted: int = 0  # of num_waiting: preempted, to be recomputed
    kv_blocks_cached: int = 0  # free blocks that still hold a cached prefix
    num_steps: int = 0  # cumulative steps that ran the model (the step timeline's count)
    # Prompt tokens a step may take beside decodes now (0: no bound), and the pacer's price
    # of a decode-only step (ms; 0: not paced or not measured yet): core/step_pacer.py
    prefill_cap: int = 0
    decode_step_ms: float = 0.0
    # Disaggregated serving (KVTransferStats), cumulative
    kv_transfer_loads: int = 0
    kv_transfer_loaded_tokens: int = 0
    kv_transfer_failed_loads: int = 0
    kv_transfer_load_seconds: float = 0.0
    kv_transfer_saved_tokens: int = 0
    # LoRA (LoRAStats): sequences per adapter name, and slot loads (cumulative)
    lora_running: dict[str, int] = {}
    lora_waiting: dict[str, int] = {}
    lora_slot_loads: int = 0
    # Vision-language models, cumulative: images encoded, found in the encoder's cache,
    # and the placeholder tokens their features filled
    images_encoded: int = 0
    image_cache_hits: int = 0
    image_tokens: int = 0


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True, tag="out"):
    updates: list[RequestUpdate] = []
    errors: list[tuple[str, str]] = []  # (request id, message): rejected by the core
    stats: EngineStats | None = None
    timestamp: float = 0.0
    # (request id, message): ended because the step that computed them failed
    step_errors: list[tuple[str, str]] = []


class EngineReady(msgspec.Struct, array_like=True, tag="ready"):
    """Sent once after start-up, so the API server knows what the core loaded."""

    model_path: str
    max_model_len: int
    vocab_size: int
    eos_token_ids: list[int]
    num_blocks: int
    block_size: int
    kv_transfer_addr: str = ""  # a prefill engine's K/V server (--kv-role prefill)
    pooling: PoolingSpec | None = None  # an embedding model (--runner pooling): how it pools
    image_token_id: int | None = None  # a vision-language model's placeholder token
    pixel_dtype: str = "float32"  # what images' float tensors are sent as (the model's dtype)


class EngineCall(msgspec.Struct, array_like=True):
    """A question for the core, answered between steps (cadence.engine.introspect)."""

    call_id: int
    method: str  # "steps" | "requests" | "start_profile" | "stop_profile"
    args: dict = {}
    client_index: int = 0  # the API process asking: the reply goes there


class EngineCallReply(msgspec.Struct, array_like=True, tag="reply"):
    call_id: int
    result: object = None  # plain data (dicts, lists, numbers, strings)
    error: str | None = None  # the call failed: why (the result is None)
    client_index: int = 0  # the API process that asked


encoder = msgspec.msgpack.Encoder()
request_decoder = msgspec.msgpack.Decoder(EngineCoreRequest)
abort_decoder = msgspec.msgpack.Decoder(list[str])
call_decoder = msgspec.msgpack.Decoder(EngineCall)
outputs_decoder = msgspec.msgpack.Decoder(EngineCoreOutputs | EngineReady | EngineCallReply)
