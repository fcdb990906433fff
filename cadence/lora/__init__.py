"""Multi-LoRA serving, the worker's side: PEFT adapters over one base model, many in one
batch. (What a request names, LoRARequest, is cadence/lora_request.py; which adapter each
slot holds is the scheduler's, cadence/core/lora_slots.py.)

    adapter.py   reading and checking a PEFT folder (adapter_config.json + safetensors)
    weights.py   a wrapped projection's stacked A / B of every slot, and the wrapper
    batch.py     per step: which tokens read which slot, and the products
    manager.py   the worker's adapters: CPU copies (LRU), slot loads, the step's plan
    dummy.py     random adapters of a model's shape, for benchmarks
"""
