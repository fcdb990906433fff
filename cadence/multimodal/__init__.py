"""Images in, text out: what an image is on the wire, how the API process turns one into
placeholder tokens and pixel tensors, and the checks both ends apply.

    media.py      data: URLs (and, where allowed, http(s) URLs) -> a bounded RGB image
    inputs.py     ImageInput: one image's placeholder span, content hash and tensors (msgspec)
    families.py   per vision-language family: its image token, how its processor's outputs
                  split per image
    processor.py  the model's Hugging Face processor: prompt text + images -> token ids and
                  ImageInputs (API process and offline LLM)

The engine side (the vision encoder, its cache, merging features into the text embeddings)
lives with the model (cadence/models/vision_language.py) and the worker
(cadence/worker/image_feeder.py). Modules here import neither torch nor the engine.
"""
