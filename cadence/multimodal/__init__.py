"""Images in, text out: what an image is on the wire, how the API process turns one into
placeholder tokens and pixel tensors, and the checks both ends apply.

    media.py      data: URLs (and, where allowed, http(s) URLs) -> a bounded RGB image
    inputs.py     ImageInput: one image's placeholder span, content hash and tensors (msgspec)
    families.py   per vision-language family: its placeholder, how its image processor's
                  outputs split per image, their token counts and any text around them
    processor.py  the model's Hugging Face image processor and its family: prompt text +
                  images -> token ids and ImageInputs (API process and offline LLM)
    chat.py       chat messages' image parts -> the template's parts and the image sources;
                  ImageReader (policy, limit, processor) for the API process and the LLM

The engine side (the vision encoder, its cache, merging features into the text embeddings)
lives with the model (cadence/models/vision_language.py) and the worker
(cadence/worker/image_feeder.py). Modules here import neither torch nor the engine when
they load (transformers and torch only inside the functions that need them).
"""
