"""The `ray` executor: rank 1 is a Ray actor placed by a placement group, on a local Ray
instance the test starts (loopback only, in a child process with a time bound), and the
tokens are transformers' greedy ones, as with the `mp` executor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from tp_helpers import hf_reference, prompts_for


@pytest.mark.slow  # starts a Ray instance and a rank of its own
def test_ray_executor_equals_transformers(tiny_model_dir, hf_model):
    path = tiny_model_dir("qwen3")
    prompts = prompts_for(path)
    script = textwrap.dedent(
        f"""
        import json, ray
        from cadence import LLM, SamplingParams
        ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
                 log_to_driver=False)
        params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        with LLM({path!r}, tensor_parallel_size=2, distributed_executor_backend="ray",
                 dtype="float32", device="cpu", kv_cache_memory=2**24) as llm:
            kind = type(llm.engine.runner).__name__
            outs = llm.generate([{{"prompt_token_ids": p}} for p in {prompts!r}], params,
                                use_tqdm=False)
        ray.shutdown()
        print("RESULT " + json.dumps([kind, [list(o.outputs[0].token_ids) for o in outs]]))
        """
    )
    env = {
        **os.environ,
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_DISABLE_IMPORT_WARNING": "1",
        # Ray runs its workers at nice 15: beside the other test workers' busy cores rank 1
        # and the placeholder got a few percent of a core (3.5 min instead of 40 s on 2).
        "RAY_worker_niceness": "0",
        # Nor start idle workers for the driver: the actors get workers of their own.
        "RAY_prestart_worker_first_driver": "0",
        "RAY_enable_worker_prestart": "0",
    }
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240, env=env
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    kind, tokens = json.loads(lines[-1].removeprefix("RESULT "))
    assert kind == "RayExecutor"
    assert tokens == hf_reference(hf_model(path), prompts, 12)
