"""Tiny random vision-language models with their processors, and transformers as the
oracle for images (shared by tests; a module of its own name)."""

from __future__ import annotations

import io

import numpy as np
import torch

# SmolLM2's tokenizer (49,152 tokens) with an image placeholder added after them.
IMAGE_TOKEN_ID = 49152
TEXT = dict(
    vocab_size=49216,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
    initializer_range=0.1,
    tie_word_embeddings=False,
)
# A template that writes each image part as the placeholder, as VLMs' templates do.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}"
    "{{ m['content'] }}{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}"
    "<image>{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tokenizer():
    from transformers import AutoTokenizer

    from cadence.loader.model_path import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path(None))
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    assert tok.convert_tokens_to_ids("<image>") == IMAGE_TOKEN_ID
    return tok


def save_tiny_vision_model(kind: str, path: str) -> None:
    """A random `kind` model (float32), its processor, tokenizer and chat template."""
    import transformers as tf

    if kind != "llava":
        raise ValueError(kind)
    vision = tf.CLIPVisionConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        projection_dim=32,
        initializer_range=0.1,
    )
    config = tf.LlavaConfig(
        vision_config=vision,
        text_config=tf.LlamaConfig(**TEXT),
        image_token_id=IMAGE_TOKEN_ID,
        initializer_range=0.1,
    )
    model = tf.LlavaForConditionalGeneration(config).eval()
    with torch.no_grad():  # visible image features: the default init is too tame
        for name, p in model.named_parameters():
            if ("vision" in name or "projector" in name) and p.dim() > 1:
                p.normal_(0, 0.2)
    model.save_pretrained(path)
    image_processor = tf.CLIPImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
    )
    tf.LlavaProcessor(
        image_processor=image_processor,
        tokenizer=_tokenizer(),
        patch_size=8,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=CHAT_TEMPLATE,
    ).save_pretrained(path)


def random_image(width: int, height: int, seed: int):
    from PIL import Image

    rng = np.random.RandomState(seed)
    return Image.fromarray(rng.randint(0, 256, (height, width, 3), dtype=np.uint8))


def data_url(image, fmt: str = "PNG") -> str:
    import base64

    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


@torch.inference_mode()
def hf_greedy_with_images(model, processor, text: str, images: list, new_tokens: int):
    """transformers' greedy continuation of `text` with `images`, never stopping at EOS,
    and the prompt's token ids (as its processor expanded them)."""
    inputs = processor(
        text=[text], images=images or None, return_tensors="pt", add_special_tokens=False
    )
    ids = inputs["input_ids"]
    extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
    out = model(input_ids=ids, use_cache=True, **extra)
    tokens = []
    for _ in range(new_tokens):
        nxt = int(out.logits[0, -1].argmax())
        tokens.append(nxt)
        out = model(
            input_ids=torch.tensor([[nxt]]), past_key_values=out.past_key_values, use_cache=True
        )
    return ids[0].tolist(), tokens
