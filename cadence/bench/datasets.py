"""Workloads of `cadence bench serve`: what each request sends.

random          random token ids decoded to text (like vLLM's random dataset), input and
                output lengths uniform in [len*(1-r), len*(1+r)]; with --random-images N,
                chat messages of N distinct random images and that text
shared-prefix   G system prompts of L random tokens, each followed by Q different random
                questions, in shuffled order: the workload prefix caches are for
jsonl           a file of {"prompt": "..."} or {"messages": [...]} lines, each with an
                optional "max_tokens" (or "output_tokens", as vLLM's custom dataset)

Prompts are plain data (`BenchPrompt`), built from a seed, so a run can be repeated.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from typing import Any

from cadence.bench.offline import sample_random_requests

# How many times a decoded random prompt is re-encoded and trimmed or padded to its length.
MAX_LENGTH_FIX_ROUNDS = 10


@dataclass
class BenchPrompt:
    """One request's input. `prompt` is text (completions) or `messages` (chat)."""

    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    max_tokens: int | None = None  # None: the server's default
    expected_prompt_tokens: int | None = None  # the tokenizer's count, for the cross-check
    group: int | None = None  # shared-prefix: which system prompt
    meta: dict[str, Any] = field(default_factory=dict)

    def as_chat(self) -> list[dict[str, Any]]:
        """The messages for /v1/chat/completions (a text prompt becomes a user message)."""
        if self.messages is not None:
            return self.messages
        return [{"role": "user", "content": self.prompt or ""}]


# ---- token counting -------------------------------------------------------------------


def count_prompt_tokens(tokenizer, prompt: BenchPrompt, chat: bool) -> int | None:
    """Prompt tokens as a server with this tokenizer counts them (chat: with the template;
    None with images, whose tokens only the model's processor knows)."""
    if tokenizer is None or prompt.meta.get("images"):
        return None
    if not chat:
        if prompt.prompt is None:
            return None
        return len(tokenizer.encode(prompt.prompt))
    if not getattr(tokenizer, "chat_template", None):
        return None
    ids = tokenizer.apply_chat_template(prompt.as_chat(), add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return len(ids)


def count_text_tokens(tokenizer, text: str) -> int | None:
    """Tokens of generated text, re-encoded (not always the count the server generated)."""
    if tokenizer is None:
        return None
    return len(tokenizer.encode(text, add_special_tokens=False)) if text else 0


# ---- random text ----------------------------------------------------------------------


def ordinary_token_ids(tokenizer) -> list[int]:
    """Token ids that decode to ordinary text: no special or added tokens."""
    special = set(tokenizer.all_special_ids)
    special.update(getattr(tokenizer, "added_tokens_decoder", {}).keys())
    return [i for i in range(len(tokenizer)) if i not in special]


def text_of_length(
    tokenizer, ids: list[int], vocab: list[int], rng: random.Random
) -> tuple[str, list[int]]:
    """Decode `ids` to text that re-encodes to len(ids) tokens where possible (vLLM's
    decode-to-target-length): re-encode, then trim or pad with random tokens, a few rounds."""
    target = len(ids)
    for _ in range(MAX_LENGTH_FIX_ROUNDS):
        text = tokenizer.decode(ids)
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) == target:
            return text, ids
        if len(ids) > target:
            ids = ids[:target]
        else:
            ids = ids + [rng.choice(vocab) for _ in range(target - len(ids))]
    return tokenizer.decode(ids), ids


def random_prompts(
    tokenizer,
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float = 0.0,
    seed: int = 0,
) -> list[BenchPrompt]:
    """`num_prompts` texts of about `input_len` random tokens each (lengths as in
    `cadence bench throughput`'s random set, from the same generator)."""
    vocab = ordinary_token_ids(tokenizer)
    rng = random.Random(seed + 1)
    raw = sample_random_requests(num_prompts, input_len, output_len, len(vocab), seed, range_ratio)
    prompts = []
    for r in raw:
        text, _ = text_of_length(tokenizer, [vocab[i] for i in r.prompt_token_ids], vocab, rng)
        prompts.append(BenchPrompt(prompt=text, max_tokens=r.output_len))
    return prompts


def random_image_url(rng: random.Random, width: int, height: int) -> str:
    """A PNG data: URL of a random image: smooth colour fields (16x16 random pixels scaled
    up), so it compresses like a photo rather than like noise, and no two are alike."""
    import base64
    import io

    from PIL import Image

    small = Image.frombytes("RGB", (16, 16), bytes(rng.randrange(256) for _ in range(768)))
    buf = io.BytesIO()
    small.resize((width, height), Image.BILINEAR).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def add_random_images(
    prompts: list[BenchPrompt], count: int, size: tuple[int, int], seed: int = 0
) -> None:
    """Each prompt becomes a chat message of `count` distinct random images of `size`
    (width, height) and then its text (a vision-language model's workload)."""
    rng = random.Random(seed + 7)
    for p in prompts:
        parts = [
            {"type": "image_url", "image_url": {"url": random_image_url(rng, *size)}}
            for _ in range(count)
        ]
        parts.append({"type": "text", "text": p.prompt or ""})
        p.messages, p.prompt = [{"role": "user", "content": parts}], None
        p.meta["images"] = count


def shared_prefix_prompts(
    tokenizer,
    num_groups: int,
    questions_per_group: int,
    prefix_len: int,
    question_len: int,
    output_len: int,
    seed: int = 0,
    chat: bool = False,
) -> list[BenchPrompt]:
    """G system prompts of `prefix_len` random tokens, each followed by Q different questions
    of `question_len` tokens; shuffled, so requests sharing a prefix are spread over the run.

    Completions: the prompt is prefix + question. Chat: a system and a user message.
    """
    vocab = ordinary_token_ids(tokenizer)
    rng = random.Random(seed)

    def random_text(n: int) -> str:
        return text_of_length(tokenizer, [rng.choice(vocab) for _ in range(n)], vocab, rng)[0]

    prompts = []
    for g in range(num_groups):
        prefix = random_text(prefix_len)
        for q in range(questions_per_group):
            question = random_text(question_len)
            if chat:
                messages = [
                    {"role": "system", "content": prefix},
                    {"role": "user", "content": question},
                ]
                p = BenchPrompt(messages=messages, max_tokens=output_len, group=g)
            else:
                p = BenchPrompt(prompt=prefix + question, max_tokens=output_len, group=g)
            p.meta["question"] = q
            prompts.append(p)
    rng.shuffle(prompts)
    return prompts


# ---- a JSONL file ---------------------------------------------------------------------


def _jsonl_entry(obj: Any, where: str, default_max_tokens: int | None) -> BenchPrompt:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    max_tokens = obj.get("max_tokens", obj.get("output_tokens", default_max_tokens))
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise ValueError(f"{where}: max_tokens must be a positive integer, got {max_tokens!r}")
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            raise ValueError(f"{where}: prompt must be a non-empty string")
        return BenchPrompt(prompt=obj["prompt"], max_tokens=max_tokens)
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
            raise ValueError(f"{where}: messages must be a non-empty list of objects")
        return BenchPrompt(messages=msgs, max_tokens=max_tokens)
    raise ValueError(f'{where}: needs a "prompt" or a "messages" field')


def load_jsonl(
    path: str, num_prompts: int | None, default_max_tokens: int | None, chat: bool
) -> list[BenchPrompt]:
    """The first `num_prompts` lines of a JSONL file (all of them if None); blank lines skip."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--dataset-path {path!r} is not a file")
    prompts: list[BenchPrompt] = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e.msg})") from None
            p = _jsonl_entry(obj, where, default_max_tokens)
            if p.messages is not None and not chat:
                raise ValueError(f'{where}: "messages" needs --endpoint chat')
            prompts.append(p)
            if num_prompts is not None and len(prompts) == num_prompts:
                break
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    if num_prompts is not None and len(prompts) < num_prompts:
        raise ValueError(f"{path} has {len(prompts)} prompts; --num-prompts asks for {num_prompts}")
    return prompts


__all__ = [
    "BenchPrompt",
    "count_prompt_tokens",
    "count_text_tokens",
    "load_jsonl",
    "ordinary_token_ids",
    "add_random_images",
    "random_prompts",
    "shared_prefix_prompts",
    "text_of_length",
]
