"""Run one engine in a fresh process and print its greedy tokens as JSON (GPU tests: a
process joins one NCCL group in its life, so each tensor-parallel engine gets its own).

    python tests/executor/tp_child.py '{"path": ..., "kwargs": {...}, "prompts": [...],
                                        "max_tokens": 24}'
"""

from __future__ import annotations

import json
import sys

from cadence import LLM, SamplingParams


def main() -> None:
    job = json.loads(sys.argv[1])
    params = SamplingParams(max_tokens=job["max_tokens"], temperature=0.0, ignore_eos=True)
    with LLM(job["path"], **job["kwargs"]) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in job["prompts"]], params)
        from cadence.distributed.parallel_state import get_tp

        graphs = llm.engine.runner.driver.graphs
        mixed = llm.engine.runner.driver.mixed_graphs
        result = {
            "mixed_graph_replays": mixed.num_replays if mixed is not None else 0,
            "tokens": [list(o.outputs[0].token_ids) for o in outs],
            "graph_replays": graphs.num_replays if graphs is not None else 0,
            "one_shot": get_tp().one_shot is not None,
        }
        print("RESULT " + json.dumps(result), flush=True)  # before shutdown: see the GPU tests


if __name__ == "__main__":
    main()
