"""Chat messages with image parts -> what a chat template renders, and the images in the
order the rendered text names them.

OpenAI content parts are accepted as they are sent:

    {"type": "text", "text": "..."}
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}   (or a str)
    {"type": "image", "image": <PIL image>}                                     (offline)

Templates of vision-language models render `{"type": "image"}` parts as the model's
placeholder; each image part becomes one, and its source is kept in order.
"""

from __future__ import annotations

from dataclasses import dataclass

from cadence.multimodal.inputs import ImageInput
from cadence.multimodal.media import MediaError, MediaPolicy, load_image
from cadence.multimodal.processor import ImagePrompts


def template_conversation(conversation: list[dict]) -> tuple[list[dict], list]:
    """(the conversation with image parts as {"type": "image"}, each image's source: a
    URL string or an image object), messages without images left as they are."""
    out, sources = [], []
    for message in conversation:
        content = message.get("content")
        if not isinstance(content, list):
            out.append(message)
            continue
        parts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                parts.append({"type": "text", "text": part.get("text", "")})
            elif kind == "image_url":
                url = part.get("image_url")
                sources.append(url.get("url") if isinstance(url, dict) else url)
                parts.append({"type": "image"})
            elif kind == "image" and "image" in part:
                sources.append(part["image"])
                parts.append({"type": "image"})
            else:
                raise MediaError(f"content part of type {kind!r} is not text or an image")
        out.append({**message, "content": parts})
    return out, sources


def resolve_images(sources: list, policy: MediaPolicy, limit: int) -> list:
    """Each source as an RGB image (URLs fetched or decoded within `policy`); MediaError
    beyond `limit` images or for one that cannot be used."""
    if len(sources) > limit:
        raise MediaError(f"{len(sources)} images in one prompt: at most {limit} are accepted")
    images = []
    for source in sources:
        if isinstance(source, str):
            images.append(load_image(source, policy))
        elif hasattr(source, "convert") and hasattr(source, "size"):  # a PIL image
            images.append(source.convert("RGB"))
        else:
            raise MediaError(f"an image must be a URL or a PIL image, not {type(source).__name__}")
    return images


@dataclass(frozen=True)
class ImageReader:
    """A vision-language model's way in for images: where they may come from, how many a
    prompt may carry, and its processor."""

    prompts: ImagePrompts
    policy: MediaPolicy
    limit: int

    def read(
        self, text: str, sources: list, add_special_tokens: bool = False
    ) -> tuple[list[int], list[ImageInput]]:
        """Token ids of `text` (whose placeholders name the images in order) and its
        ImageInputs; MediaError for images that cannot be used."""
        images = resolve_images(sources, self.policy, self.limit)
        return self.prompts.process(text, images, add_special_tokens)
