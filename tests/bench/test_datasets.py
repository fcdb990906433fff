"""The workloads of `cadence bench serve`, with the SmolLM2 tokenizer."""

from __future__ import annotations

import json

import pytest

from cadence.bench.datasets import (
    add_random_images,
    count_prompt_tokens,
    load_jsonl,
    random_prompts,
    shared_prefix_prompts,
)


def test_random_prompts_have_the_asked_lengths(tokenizer):
    prompts = random_prompts(tokenizer, 8, input_len=64, output_len=16, seed=1)
    assert len(prompts) == 8
    lens = [count_prompt_tokens(tokenizer, p, chat=False) for p in prompts]
    assert all(abs(n - 64) <= 1 for n in lens), lens
    assert sum(n == 64 for n in lens) >= 6, lens
    assert all(p.max_tokens == 16 for p in prompts)
    assert len({p.prompt for p in prompts}) == 8
    for p in prompts:  # only ordinary tokens: no chat markers
        assert "<|im_start|>" not in p.prompt and "<|endoftext|>" not in p.prompt
    again = random_prompts(tokenizer, 8, input_len=64, output_len=16, seed=1)
    assert [p.prompt for p in again] == [p.prompt for p in prompts]
    other = random_prompts(tokenizer, 8, input_len=64, output_len=16, seed=2)
    assert other[0].prompt != prompts[0].prompt


def test_random_prompts_range_ratio(tokenizer):
    prompts = random_prompts(tokenizer, 20, 40, 20, range_ratio=0.5, seed=0)
    lens = [count_prompt_tokens(tokenizer, p, chat=False) for p in prompts]
    outs = [p.max_tokens for p in prompts]
    assert all(19 <= n <= 61 for n in lens), lens
    assert all(10 <= n <= 30 for n in outs) and len(set(outs)) > 3


@pytest.mark.parametrize("chat", [False, True])
def test_shared_prefix_groups(tokenizer, chat):
    prompts = shared_prefix_prompts(
        tokenizer, num_groups=3, questions_per_group=4, prefix_len=32, question_len=8,
        output_len=5, seed=0, chat=chat,
    )  # fmt: skip
    assert len(prompts) == 12
    assert sorted(p.group for p in prompts) == [0] * 4 + [1] * 4 + [2] * 4
    groups = [p.group for p in prompts]
    assert groups != sorted(groups), "the order is shuffled"
    prefixes: dict[int, set[str]] = {}
    for p in prompts:
        assert p.max_tokens == 5
        if chat:
            system, user = p.messages
            assert system["role"] == "system" and user["role"] == "user"
            prefixes.setdefault(p.group, set()).add(system["content"])
        else:
            # 32 prefix tokens; the join with the question may merge the last one or two
            head = tuple(tokenizer.encode(p.prompt)[:30])
            prefixes.setdefault(p.group, set()).add(json.dumps(head))
    assert all(len(s) == 1 for s in prefixes.values()), "one system prompt per group"
    assert len({next(iter(s)) for s in prefixes.values()}) == 3
    texts = [json.dumps(p.messages) if chat else p.prompt for p in prompts]
    assert len(set(texts)) == 12, "every question differs"


def test_jsonl(tmp_path):
    path = tmp_path / "p.jsonl"
    lines = [
        {"prompt": "hello", "max_tokens": 7},
        {"messages": [{"role": "user", "content": "hi"}]},
        {"prompt": "there", "output_tokens": 3},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    prompts = load_jsonl(str(path), None, 11, chat=True)
    assert [p.max_tokens for p in prompts] == [7, 11, 3]
    assert prompts[0].as_chat() == [{"role": "user", "content": "hello"}]
    assert prompts[1].messages == lines[1]["messages"]
    assert len(load_jsonl(str(path), 2, 11, chat=True)) == 2
    with pytest.raises(ValueError, match="has 3 prompts; --num-prompts asks for 5"):
        load_jsonl(str(path), 5, 11, chat=True)
    with pytest.raises(ValueError, match=r"p.jsonl:2: \"messages\" needs --endpoint chat"):
        load_jsonl(str(path), None, 11, chat=False)


@pytest.mark.parametrize(
    "line, message",
    [
        ("not json", "p.jsonl:2: not JSON"),
        ('{"text": "x"}', 'p.jsonl:2: needs a "prompt" or a "messages" field'),
        ('{"prompt": ""}', "p.jsonl:2: prompt must be a non-empty string"),
        ('{"prompt": "x", "max_tokens": 0}', "p.jsonl:2: max_tokens must be a positive"),
        ('{"messages": []}', "p.jsonl:2: messages must be a non-empty list"),
        ("[1, 2]", "p.jsonl:2: expected a JSON object"),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path, line, message):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "ok"}\n' + line + "\n")
    with pytest.raises(ValueError, match=message):
        load_jsonl(str(path), None, 8, chat=True)


def test_random_images_make_chat_messages_of_distinct_decodable_images(tokenizer):
    from cadence.multimodal.media import MediaPolicy, load_image

    prompts = random_prompts(tokenizer, 3, 8, 4, seed=1)
    texts = [p.prompt for p in prompts]
    add_random_images(prompts, 2, (40, 24), seed=1)
    urls = []
    for p, text in zip(prompts, texts):
        assert p.prompt is None and p.meta["images"] == 2
        (message,) = p.messages
        *images, last = message["content"]
        assert last == {"type": "text", "text": text}
        urls += [part["image_url"]["url"] for part in images]
    assert len(set(urls)) == 6
    assert all(load_image(url, MediaPolicy()).size == (40, 24) for url in urls)
