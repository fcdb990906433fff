"""Loading a checkpoint into a decoder: names mapped by the family, each parallel layer
taking its own rank's rows or columns, fused projections filled shard by shard.

A checkpoint stores q/k/v (and gate/up) either apart (`q_proj`, ...: the family's
`fused_names` says which shard of our fused weight each is) or already fused (Phi-3's
`qkv_proj`, `gate_up_proj`): then the rows are split into the shards here."""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from cadence.layers.linear import ColumnParallelLinear, shape_of
from cadence.models.moe import FusedExperts


class Rows:
    """Rows [start, start + count) of a tensor or safetensors slice, sliceable like one
    (what a parallel layer's `load` reads from)."""

    def __init__(self, source, start: int, count: int) -> None:
        self.source, self.start, self.count = source, start, count
        self.shape = (count, *shape_of(source)[1:])

    def __getitem__(self, index):
        index = index if isinstance(index, tuple) else (index,)
        rows = index[0]
        if rows is Ellipsis:
            rows, index = slice(None), (slice(None), *index[1:])
        lo, hi, step = rows.indices(self.count)
        return self.source[(slice(self.start + lo, self.start + hi, step), *index[1:])]


def _kv_scale_of(name: str) -> tuple[int, str] | None:
    """(layer, "k" or "v") when a checkpoint name is a KV-cache scale: `self_attn.k_scale`
    / `v_scale` (compressed-tensors), or `k_proj.output_scale` / `v_proj.output_scale`."""
    parts = name.split(".")
    if len(parts) < 4 or parts[0] != "layers":
        return None
    tail = ".".join(parts[2:])
    for which in ("k", "v"):
        if tail in (f"self_attn.{which}_scale", f"self_attn.{which}_proj.output_scale"):
            return int(parts[1]), which
    return None


def _expert_of(name: str) -> tuple[str, int, str] | None:
    """(owner, expert, piece) for a mixture's per-expert weight `<owner>.<expert>.<piece>.
    weight` whose owner ends in `experts` (`layers.1.mlp.experts.3.w1.weight`)."""
    parts = name.split(".")
    if len(parts) < 4 or parts[-1] != "weight" or not parts[-3].isdigit():
        return None
    if parts[-4] != "experts":
        return None
    return ".".join(parts[:-3]), int(parts[-3]), parts[-2]


def load_checkpoint(model: nn.Module, weights: Iterable[tuple[str, object]]) -> None:
    """Load (name, tensor or safetensors slice) pairs in the checkpoint's naming into a
    DecoderForCausalLM; raise ValueError on an unknown name, a shape that does not fit, or
    a weight the checkpoint lacks."""
    modules = dict(model.named_modules())
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for name, source in weights:
        name = model.checkpoint_name(name.removeprefix("model."))
        if name is None or "rotary_emb.inv_freq" in name:
            continue
        if name == "lm_head.weight" and model.lm_head is None:
            continue  # tied: the embedding serves
        if (kv := _kv_scale_of(name)) is not None:
            layer, which = kv
            attn = model.layers[layer].self_attn
            value = float(source[...] if shape_of(source) == () else source[:].max())
            k, v = attn.kv_scale
            attn.kv_scale = (value, v) if which == "k" else (k, value)
            continue
        owner, _, piece = name.rpartition(".")
        if piece in FusedExperts.STACKED and isinstance(modules.get(owner), FusedExperts):
            modules[owner].load_stacked(piece, source)  # (every expert in one tensor)
            continue
        if (expert := _expert_of(name)) is not None:
            owner, index, piece = expert
            module = modules.get(owner)
            if not isinstance(module, FusedExperts):
                raise ValueError(f"unexpected weight {name!r} in the checkpoint")
            module.load_expert(piece, source, index)
            continue
        owner, _, kind = name.rpartition(".")
        if owner.rpartition(".")[2] in model.prefused_names and kind in ("weight", "bias"):
            module = modules.get(owner)
            if not isinstance(module, ColumnParallelLinear):
                raise ValueError(f"unexpected weight {name!r} in the checkpoint")
            start = 0
            for shard, s in enumerate(module.shards):
                module.load(kind, Rows(source, start, s.rows), shard)
                loaded.add(f"{name}#{shard}")
                start += s.rows
            if start != shape_of(source)[0]:
                raise ValueError(f"{name}: {shape_of(source)[0]} rows, the shards hold {start}")
            continue
        shard = 0
        for piece, (fused, index) in model.fused_names.items():
            if f".{piece}." in name:
                name, shard = name.replace(piece, fused), index
                break
        owner, _, kind = name.rpartition(".")
        module = modules.get(owner)
        if name not in params or module is None:
            raise ValueError(f"unexpected weight {name!r} in the checkpoint")
        if hasattr(module, "load"):  # a parallel layer: it takes its own shard
            module.load(kind, source, shard)
        else:
            param = params[name]
            if shape_of(source) != tuple(param.shape):
                raise ValueError(
                    f"{name}: checkpoint shape {shape_of(source)} != model's {tuple(param.shape)}"
                )
            param.data.copy_(source[:])
        loaded.add(f"{name}#{shard}")
    missing = [
        f"{owner}: {what}"
        for owner, module in modules.items()
        if isinstance(module, FusedExperts)
        for what in module.missing()
    ]
    for name in params:
        if name.rpartition(".")[2] not in ("weight", "bias", "sinks", "e_score_correction_bias"):
            continue  # a format's optional extras (scales) default where absent
        owner = modules[name.rpartition(".")[0]]
        shards = len(getattr(owner, "shards", ())) or 1  # (a fused layer: each shard)
        missing += [name for i in range(shards) if f"{name}#{i}" not in loaded]
    if missing:
        raise ValueError(
            f"checkpoint lacks weights: {missing[:5]}{' …' if len(missing) > 5 else ''}"
        )
