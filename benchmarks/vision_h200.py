"""Issue 34's GPU figures: Qwen2.5-VL-7B's shape (benchmarks/qwen2.5-vl-7b, dummy bf16
weights), offline in one process:

  - 64 requests at once, each one distinct 448x448 image + 64 text tokens -> 128 tokens
    (EOS ignored): requests/s, output tok/s, TTFT p50/p90, per-request decode tok/s; the
    same 64 prompts without their images beside it (what the images cost);
  - one request alone: TTFT and decode tok/s;
  - the vision encoder alone: ms per image at 1 and 64 images a call, and at 1 in its
    CUDA graph (worker/encoder_graphs.py), and its TFLOP/s against the FLOPs an image
    takes (2 x its multiply-adds); batch 1 again with the encoder eager;
  - the API side's image preprocessing (the HF image processor, CPU): ms per image.

The model folder is made here: the config, SmolLM2's tokenizer with the four Qwen vision
tokens added (at the ids the config names), and Qwen2-VL's default image processor.

    python benchmarks/vision_h200.py --tokenizer .gpu-smoke/smollm2 --json OUT/vision.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.abspath(__file__))
TOKENS = ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"]
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
# Qwen2-VL's way of writing content parts: an image part as its placeholder
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}"
    "{{ m['content'] }}{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}"
    + IMAGE
    + "{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = " hello" * 56  # (56 tokens: with the template's, 64 text tokens a prompt)


def make_folder(config_dir: str, tokenizer_dir: str, vocab: int | None = None) -> str:
    """`vocab`: the language model's vocabulary cut to this (the tokenizer's, rounded up):
    a streaming client then sees text for (nearly) every token the dummy model samples,
    as in benchmarks/device_wheels.sh's llama8b-v49k."""
    from transformers import AutoTokenizer, Qwen2VLImageProcessor

    out = tempfile.mkdtemp(prefix="vision-bench-")
    with open(os.path.join(config_dir, "config.json")) as f:
        config = json.load(f)
    if vocab:
        config["text_config"]["vocab_size"] = vocab
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.add_special_tokens({"additional_special_tokens": TOKENS})
    assert tok.convert_tokens_to_ids(TOKENS[0]) == 49152
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    own = os.path.join(config_dir, "preprocessor_config.json")
    if os.path.exists(own):
        shutil.copy(own, out)
    else:
        Qwen2VLImageProcessor().save_pretrained(out)  # (min 56x56, max 28x28x1280 pixels)
    return out


def images(n: int, side: int, seed: int):
    from PIL import Image

    rng = np.random.RandomState(seed)
    return [Image.fromarray(rng.randint(0, 256, (side, side, 3), dtype=np.uint8)) for _ in range(n)]


def run(llm, requests, params) -> dict:
    t0 = time.perf_counter()
    outs = llm.generate(requests, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    ttft = sorted(o.metrics.time_to_first_token for o in outs)
    decode = [
        (len(o.outputs[0].token_ids) - 1) / (o.metrics.last_token_time - o.metrics.first_token_time)
        for o in outs
    ]
    out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {
        "requests": len(outs),
        "wall_s": wall,
        "requests_per_s": len(outs) / wall,
        "output_tok_per_s": out_tokens / wall,
        "ttft_p50_ms": 1e3 * ttft[len(ttft) // 2],
        "ttft_p90_ms": 1e3 * ttft[int(len(ttft) * 0.9)],
        "decode_tok_per_s_per_request_p50": statistics.median(decode),
        "prompt_tokens": len(outs[0].prompt_token_ids),
    }


def encoder_ms(encode, inputs, iters: int = 3) -> float:
    """ms an image of `encode(inputs)` (the model's eager encode_images, or the encoder
    graphs' encode)."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    encode(inputs)  # warm (a graph's capture)
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        encode(inputs)
    sync()
    return 1e3 * (time.perf_counter() - t0) / iters / len(inputs)


def encoder_flops(vc, patches: int) -> float:
    """2 x multiply-adds of one image's pass: projections and MLPs of every layer, the
    patch embedding and the merger (attention's score products left out: windows of 64)."""
    d, i = vc.hidden_size, vc.intermediate_size
    per_patch = vc.depth * (4 * d * d + 3 * d * i) + 3 * vc.patch_size**2 * 2 * d
    merged = patches // 4
    merger = merged * ((4 * d) ** 2 + 4 * d * vc.out_hidden_size)
    return 2.0 * (patches * per_patch + merger)


def write_dataset(path: str, n: int, side: int, seed: int, max_tokens: int) -> None:
    """A JSONL of n chat requests for `cadence bench serve --endpoint chat`: one distinct
    image (a PNG data: URL) and the same words each."""
    import base64
    import io

    with open(path, "w") as f:
        for pic in images(n, side, seed):
            buf = io.BytesIO()
            pic.save(buf, format="PNG")
            url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
            content = [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": WORDS},
            ]
            f.write(
                json.dumps(
                    {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
                )
                + "\n"
            )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument(
        "--make-folder", action="store_true", help="only make the model folder, print it"
    )
    p.add_argument("--dataset", nargs=3, metavar=("PATH", "N", "SEED"), help="only write a JSONL")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--config", default=os.path.join(ROOT, "qwen2.5-vl-7b"), help="its folder")
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=None, help="cut the vocabulary to this")
    p.add_argument("--image-size", type=int, default=448)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--json", default=None)
    args = p.parse_args()

    if args.dataset:
        path, n, seed = args.dataset
        return write_dataset(path, int(n), args.image_size, int(seed), args.output_len)
    folder = make_folder(args.config, args.tokenizer, args.vocab)
    if args.make_folder:
        return print(folder)

    from cadence import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(
        folder, load_format=args.load_format, dtype="bfloat16", max_model_len=args.max_model_len
    )
    start_s = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    text = "<|im_start|>user\n{}" + WORDS + "<|im_end|>\n<|im_start|>assistant\n"

    def requests(n: int, seed: int, with_images: bool = True):
        pics = images(n, args.image_size, seed)
        return [
            {"prompt": text.format(IMAGE), "multi_modal_data": {"image": pic}}
            if with_images
            else {"prompt": text.format("")}
            for pic in pics
        ]

    run(llm, requests(4, 0), params)  # warm-up: kernels, graphs' first replays
    run(llm, requests(1, 5), params)  # (and the encoder graph's capture: one image alone)
    pics = images(args.batch, args.image_size, 1)
    t0 = time.perf_counter()
    processed = [llm.images.read(text.format(IMAGE), [pic]) for pic in pics]
    preprocess_ms = 1e3 * (time.perf_counter() - t0) / len(pics)
    result = {
        "engine_start_s": start_s,
        "image_preprocess_ms_per_image": preprocess_ms,
        "tokens_per_image": processed[0][1][0].length,
        f"batch{args.batch}": run(llm, requests(args.batch, 2), params),
        f"batch{args.batch}_text_only": run(llm, requests(args.batch, 3, False), params),
        "batch1": [run(llm, requests(1, 10 + i), params) for i in range(3)],
    }
    # The same without the encoder's CUDA graph (one image a request: the graph's case).
    feeder = llm.engine.runner.driver.images
    graphs, feeder.graphs = feeder.graphs, None
    result["batch1_encoder_eager"] = [run(llm, requests(1, 20 + i), params) for i in range(3)]
    feeder.graphs = graphs
    model = llm.engine.runner.driver.model
    inputs = [images_[0] for _, images_ in processed]
    vc = llm.engine.runner.driver.hf_config.vision_config
    grid = inputs[0].tensors["image_grid_thw"].to_torch()[0].tolist()
    flops = encoder_flops(vc, grid[0] * grid[1] * grid[2])
    for n in (1, args.batch):
        ms = encoder_ms(model.encode_images, inputs[:n])
        result[f"encoder_ms_per_image_at_{n}"] = ms
        result[f"encoder_tflops_at_{n}"] = flops / (ms * 1e-3) / 1e12
    if graphs is not None:
        ms = encoder_ms(graphs.encode, inputs[:1], iters=10)
        result["encoder_ms_per_image_at_1_graph"] = ms
        result["encoder_tflops_at_1_graph"] = flops / (ms * 1e-3) / 1e12
    result["encoder_gflop_per_image"] = flops / 1e9
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
