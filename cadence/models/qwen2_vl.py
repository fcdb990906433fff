"""Qwen2-VL and Qwen2.5-VL: a vision transformer over 14-pixel patches of two frames
(an image is its own frame twice), rotary positions over each patch's (row, column),
attention within each image (Qwen2.5-VL: within windows of 112 pixels, but in the
`fullatt_block_indexes` layers), a merger of 2x2 neighbouring patches into one token; and
a Qwen2 language model whose rotary positions are three-dimensional (M-RoPE).

M-RoPE: a text token's position is one number, used for all three streams; an image's
tokens take (t, row, column) offsets from where the text stopped, and the text after an
image resumes past the image's largest side. A request's positions are therefore not its
token indices: `mrope_positions` computes its prompt's once, and every later token sits at
its index plus the prompt's `delta` (negative after an image). The rotary dims are split
by `mrope_section` (of half the head dim): the first section rotates by t, the next by
row, the last by column.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from cadence.layers.norm import RMSNorm
from cadence.layers.rotary import RotaryEmbedding
from cadence.models.vision_attention import SegmentPlan, segment_attention, segment_plan
from cadence.models.vision_language import VisionLanguageModel
from cadence.models.vision_layers import StackedLinear, activation
from cadence.multimodal.inputs import ImageInput


class MRotaryEmbedding(RotaryEmbedding):
    """Rotary tables read by one position per token ([T]: every stream alike, as text and
    decodes are) or three ([3, T]: an image's t, row, column)."""

    def __init__(self, config, head_dim: int, max_position: int) -> None:
        params = dict(getattr(config, "rope_parameters", None) or {})
        scaling = getattr(config, "rope_scaling", None) or {}
        section = params.get("mrope_section") or scaling.get("mrope_section") or [16, 24, 24]
        if params.get("rope_type") == "mrope":  # (older configs' name for default + sections)
            config.rope_parameters = {**params, "rope_type": "default"}
        super().__init__(config, head_dim, max_position)
        if 2 * sum(section) != head_dim:
            raise ValueError(f"mrope_section {section} does not cover {head_dim} rotary dims")
        streams = torch.cat([torch.full((n,), i % 3) for i, n in enumerate(section)])
        self.register_buffer("stream", torch.cat([streams, streams]), persistent=False)

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype):
        if positions.dim() == 1:
            return super().lookup(positions, dtype)
        index = self.stream.view(1, 1, -1).expand(1, positions.shape[1], -1)
        cos = self.cos[positions].gather(0, index)[0]
        sin = self.sin[positions].gather(0, index)[0]
        return cos.unsqueeze(1).to(dtype), sin.unsqueeze(1).to(dtype)


def mrope_positions(
    prompt_len: int, images: list[ImageInput], merge: int
) -> tuple[np.ndarray, int]:
    """([3, prompt_len] positions of the prompt's tokens, delta of every later token)."""
    pos = np.empty((3, prompt_len), dtype=np.int64)
    cur = done = 0
    for image in images:
        n = image.offset - done
        pos[:, done : image.offset] = np.arange(cur, cur + n)
        cur += n
        t, h, w = (int(x) for x in image.tensors["image_grid_thw"].to_torch()[0])
        gt, gh, gw = np.meshgrid(
            np.arange(t), np.arange(h // merge), np.arange(w // merge), indexing="ij"
        )
        pos[0, image.offset : image.end] = gt.ravel() + cur
        pos[1, image.offset : image.end] = gh.ravel() + cur
        pos[2, image.offset : image.end] = gw.ravel() + cur
        cur += max(h, w) // merge
        done = image.end
    pos[:, done:] = np.arange(cur, cur + prompt_len - done)
    return pos, int(pos.max()) + 1 - prompt_len if prompt_len else 0


def vision_rotary(grids: list[tuple[int, int, int]], merge: int, inv_freq: torch.Tensor):
    """(cos, sin) [patches, head_dim] of each patch's (row, column), in the processor's
    order (merge x merge blocks of neighbours consecutive)."""
    rows = []
    for t, h, w in grids:
        hh, ww = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        shape = (h // merge, merge, w // merge, merge)
        hw = torch.stack(
            [
                hh.reshape(shape).transpose(1, 2).flatten(),
                ww.reshape(shape).transpose(1, 2).flatten(),
            ],
            -1,
        )
        rows.append(hw.repeat(t, 1))
    pos = torch.cat(rows).to(inv_freq.device)
    freqs = (pos[..., None].float() * inv_freq).flatten(1)  # [N, 2 * head_dim / 4]: h then w
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x32 = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat([-x32[..., half:], x32[..., :half]], dim=-1)
    return (x32 * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


class VisionAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, cos, sin, plan: SegmentPlan) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.num_heads, -1).unbind(1)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        return self.proj(segment_attention(q, k, v, plan).reshape(n, -1))


class VisionMLP(nn.Module):
    """Qwen2-VL's fc1 / fc2, or Qwen2.5-VL's gated gate / up / down (with biases)."""

    def __init__(self, dim: int, hidden: int, act: str, gated: bool) -> None:
        super().__init__()
        self.gated = gated
        self.act = activation(act)
        if gated:
            self.gate_up_proj = StackedLinear(dim, [hidden, hidden])
            self.down_proj = nn.Linear(hidden, dim)
        else:
            self.fc1 = nn.Linear(dim, hidden)
            self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(self.act(gate) * up)
        return self.fc2(self.act(self.fc1(x)))


class VisionBlock(nn.Module):
    def __init__(self, vc, gated: bool) -> None:
        super().__init__()
        dim = vc.embed_dim if not gated else vc.hidden_size
        norm = (lambda: RMSNorm(dim, 1e-6)) if gated else (lambda: nn.LayerNorm(dim, eps=1e-6))
        self.norm1, self.norm2 = norm(), norm()
        self.attn = VisionAttention(dim, vc.num_heads)
        hidden = vc.intermediate_size if gated else int(dim * vc.mlp_ratio)
        self.mlp = VisionMLP(dim, hidden, vc.hidden_act, gated)

    def forward(self, x, cos, sin, plan: SegmentPlan) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, plan)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    def __init__(self, out_dim: int, dim: int, merge: int, rms: bool) -> None:
        super().__init__()
        self.width = dim * merge * merge
        self.ln_q = RMSNorm(dim, 1e-6) if rms else nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(self.width, self.width), nn.GELU(), nn.Linear(self.width, out_dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).view(-1, self.width))


def window_order(
    grids: list[tuple[int, int, int]], merge: int, window: int
) -> tuple[torch.Tensor, list[int]]:
    """Qwen2.5-VL's windows: (an order of the merged tokens that makes each window's
    consecutive, the windows' lengths in patches), over all images in turn."""
    order, lengths, base = [], [], 0
    for t, h, w in grids:
        gh, gw = h // merge, w // merge
        index = torch.arange(t * gh * gw).view(t, gh, gw)
        for frame in range(t):
            for r in range(0, gh, window):
                for c in range(0, gw, window):
                    cell = index[frame, r : r + window, c : c + window].flatten()
                    order.append(cell + base)
                    lengths.append(cell.numel() * merge * merge)
        base += t * gh * gw
    return torch.cat(order), lengths


class VisionPlan(NamedTuple):
    """A batch of images' rotary tables, attention segments and window order (Qwen2.5-VL;
    None for Qwen2-VL), on the device."""

    cos: torch.Tensor  # [patches, head_dim], in window order where windowed
    sin: torch.Tensor
    frames: SegmentPlan  # each frame's patches (the full-attention layers)
    windows: SegmentPlan  # each window's (the others; Qwen2-VL: the frames')
    order: torch.Tensor | None = None  # merged tokens in window order
    unorder: torch.Tensor | None = None  # its inverse


class QwenVisionTransformer(nn.Module):
    """`windowed`: Qwen2.5-VL (RMS norms, gated MLPs, windows but in the full-attention
    layers); else Qwen2-VL."""

    def __init__(self, vc, windowed: bool) -> None:
        super().__init__()
        dim = vc.hidden_size if windowed else vc.embed_dim
        self.merge = vc.spatial_merge_size
        self.windowed = windowed
        self.window = vc.window_size // vc.spatial_merge_size // vc.patch_size if windowed else 0
        self.full_layers = set(getattr(vc, "fullatt_block_indexes", []) or [])
        self.patch_embed = nn.Module()
        kernel = (vc.temporal_patch_size, vc.patch_size, vc.patch_size)
        self.patch_embed.proj = nn.Conv3d(vc.in_channels, dim, kernel, stride=kernel, bias=False)
        self.patch_shape = (vc.in_channels, *kernel)
        self.blocks = nn.ModuleList(VisionBlock(vc, windowed) for _ in range(vc.depth))
        out = vc.out_hidden_size if windowed else vc.hidden_size
        self.merger = PatchMerger(out, dim, self.merge, rms=windowed)
        head_dim = dim // vc.num_heads
        theta = (getattr(vc, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
        quarter = torch.arange(0, head_dim // 2, 2, dtype=torch.float) / (head_dim // 2)
        self.register_buffer("inv_freq", 1.0 / theta**quarter, persistent=False)

    def forward(self, pixels: torch.Tensor, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        """[patches, C*T*P*P] of the images in turn -> [patches / merge^2, out] tokens."""
        return self.run(pixels, self.stage(grids, pixels.device))

    def stage(self, grids: list[tuple[int, int, int]], device: torch.device) -> VisionPlan:
        """What the images' grids alone decide, as device tensors: built once for a
        captured encoder (run() then takes no host data)."""
        cos, sin = vision_rotary(grids, self.merge, self.inv_freq)
        frames = segment_plan([h * w for t, h, w in grids for _ in range(t)], device)
        if not self.windowed:
            return VisionPlan(cos, sin, frames, frames)
        order, windows = window_order(grids, self.merge, self.window)
        order = order.to(device)
        unit = self.merge * self.merge

        def by_window(t: torch.Tensor) -> torch.Tensor:
            return t.view(-1, unit, t.shape[-1])[order].view(-1, t.shape[-1])

        return VisionPlan(
            by_window(cos),
            by_window(sin),
            frames,
            segment_plan(windows, device),
            order,
            torch.argsort(order),
        )

    def run(self, pixels: torch.Tensor, plan: VisionPlan) -> torch.Tensor:
        weight = self.patch_embed.proj.weight
        x = self.patch_embed.proj(pixels.view(-1, *self.patch_shape).to(weight.dtype))
        x = x.view(pixels.shape[0], -1)
        if plan.order is not None:  # each window's patches consecutive
            unit = self.merge * self.merge
            x = x.view(-1, unit, x.shape[-1])[plan.order].view(-1, x.shape[-1])
        for i, block in enumerate(self.blocks):
            full = not self.windowed or i in self.full_layers
            x = block(x, plan.cos, plan.sin, plan.frames if full else plan.windows)
        x = self.merger(x)
        return x if plan.order is None else x[plan.unorder]


class Qwen2VLForConditionalGeneration(VisionLanguageModel):
    vision_prefixes = ("visual.",)
    language_model = "Qwen2ForCausalLM"
    windowed = False
    uses_mrope = True

    def rotary_tables(self, config, max_position: int):
        from cadence.models.decoder import rotary_dim_of

        return {"global": MRotaryEmbedding(config, rotary_dim_of(config), max_position)}

    def build_vision(self, config) -> None:
        vc = config.vision_config
        self.visual = QwenVisionTransformer(vc, self.windowed)
        self.merge = vc.spatial_merge_size
        self.patch_width = vc.in_channels * vc.temporal_patch_size * vc.patch_size**2

    def check_image(self, image: ImageInput) -> None:
        grid = image.tensors["image_grid_thw"]
        pixels = image.tensors["pixel_values"]
        if grid.shape != [1, 3] or grid.dtype != "int64":
            raise ValueError(
                f"image_grid_thw of shape {grid.shape} ({grid.dtype}): expected [1, 3]"
            )
        t, h, w = (int(v) for v in grid.to_torch()[0])
        if min(t, h, w) < 1 or h % self.merge or w % self.merge:
            raise ValueError(f"a grid of {t}x{h}x{w} patches")
        if pixels.shape != [t * h * w, self.patch_width]:
            raise ValueError(f"pixel_values of shape {pixels.shape} for a {t}x{h}x{w} grid")
        if image.length != t * h * w // self.merge**2:
            raise ValueError(f"{image.length} placeholder tokens for {t * h * w} patches")

    def encode(self, images: list[ImageInput]) -> list[torch.Tensor]:
        like = self.visual.patch_embed.proj.weight
        pixels = torch.cat([self.device_tensor(image, "pixel_values", like) for image in images])
        grids = [
            tuple(int(v) for v in image.tensors["image_grid_thw"].to_torch()[0]) for image in images
        ]
        tokens = self.visual(pixels, grids)
        return list(tokens.split([image.length for image in images]))

    def graph_input(self, images: list[ImageInput]):
        if len(images) != 1:
            return None
        grid = tuple(int(v) for v in images[0].tensors["image_grid_thw"].to_torch()[0])
        return grid, self.device_tensor(
            images[0], "pixel_values", self.visual.patch_embed.proj.weight
        )

    def graph_body(self, key):
        plan = self.visual.stage([key], self.visual.inv_freq.device)
        return lambda pixels: self.visual.run(pixels, plan)

    def mrope_positions(self, prompt_len: int, images: list[ImageInput]) -> tuple[np.ndarray, int]:
        return mrope_positions(prompt_len, images, self.merge)


class Qwen2_5_VLForConditionalGeneration(Qwen2VLForConditionalGeneration):
    windowed = True
