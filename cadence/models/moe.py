"""Mixture-of-experts feed-forward blocks: a router picks each token's top-k experts, the
experts' SwiGLU MLPs run on the tokens routed to them, and their outputs are summed by the
routing weights (plus, in Qwen2-MoE, a shared expert behind a sigmoid gate; GPT-OSS adds
biases to the router and to every expert GEMM and gates with a clamped SwiGLU).

    SparseMoE        Router (replicated, hidden -> expert logits), FusedExperts, shared expert
    FusedExperts     every expert's weights stacked: w13_weight [E, 2 * I, H] (gate rows,
                     then up), w2_weight [E, H, I]; under tensor parallelism each rank
                     holds every expert's I / tp columns, as a dense MLP's, or with
                     `--enable-expert-parallel` E / tp whole experts (a pair routed to
                     another rank's expert adds nothing here); either way the block's
                     output is all-reduced. Under `--quantization fp8` the weights are
                     e4m3 with w13_scale / w2_scale (cadence/quant/fp8_experts.py).
    route()          softmax over the experts in float32, top-k, optional renormalisation
    route_grouped()  DeepSeek-V3's and GLM-4.5's: sigmoid scores, a correction bias that
                     steers the choice only, the best groups of experts first, then top-k
                     among theirs, renormalised and scaled; DeepSeek-V2's alike over
                     softmax scores (a group ranked by its best expert)

On the CPU: tokens sorted by expert, one GEMM pair per expert that received any token
(`forward_reference`); on CUDA the Triton grouped GEMMs of cadence/ops/fused_moe.py.
Checkpoints store experts one by one (`experts.3.w1`, Mixtral; `experts.3.gate_proj`, Qwen
and OLMoE; `load_expert` fills the stacked rows) or stacked (`load_stacked`): transformers
5's layout (`gate_up_proj` [E, 2I, H], gate rows then up) or GPT-OSS's (`gate_up_proj`
[E, H, 2I] with gate and up columns interleaved, `down_proj` [E, I, H], and biases).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cadence.distributed.communication import all_reduce
from cadence.distributed.parallel_state import expert_parallel, get_tp
from cadence.layers.activation import ClampedSwigluAndMul, SiluAndMul
from cadence.layers.linear import divide
from cadence.models.mlp import GatedMLP, activation_of
from cadence.quant.base import current_method, shape_of


@dataclass(frozen=True)
class MoEOptions:
    num_experts: int
    top_k: int
    intermediate_size: int  # each expert's
    renormalize: bool  # the top-k weights rescaled to sum to 1
    # The routing weights stay float32 into the weighted sum (Mixtral); False: cast to the
    # activations' dtype first (Qwen, OLMoE).
    float32_weights: bool = False
    shared_intermediate_size: int = 0  # a shared expert's (0: none)
    shared_gate: bool = True  # the shared expert's output behind a sigmoid gate (Qwen2-MoE)
    router_bias: bool = False  # the router's Linear has a bias (GPT-OSS)
    expert_bias: bool = False  # every expert GEMM adds a bias (GPT-OSS)
    clamped_swiglu: tuple[float, float] | None = None  # (alpha, limit): GPT-OSS's gate
    stacked_layout: str = "rows"  # "rows" (transformers 5) | "gpt_oss": see load_stacked
    # Sigmoid routing (DeepSeek-V3, GLM-4.5; route_grouped): the router in float32 with a
    # correction bias, experts in num_groups groups of which topk_groups are eligible, the
    # chosen weights multiplied by routed_scale.
    scoring: str = "softmax"  # "softmax" | "sigmoid"
    num_groups: int = 1
    topk_groups: int = 1
    routed_scale: float = 1.0
    float32_router: bool = False  # softmax scoring from a float32 router (DeepSeek-V2)

    @property
    def plain_topk(self) -> bool:
        """Softmax, top-k, maybe renormalised: nothing route() does not do."""
        return self.scoring == "softmax" and self.num_groups == 1 and self.routed_scale == 1.0


def route(
    logits: torch.Tensor,
    top_k: int,
    renormalize: bool,
    out_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] in out_dtype, expert ids [T, k]) from router logits [T, E]: the
    softmax in float32, its top k, optionally renormalised, then cast. On CUDA one Triton
    kernel (cadence/ops/moe_routing.py) instead of softmax, top-k, sum and cast."""
    if logits.is_cuda:
        from cadence.ops import moe_routing

        return moe_routing.topk_softmax(logits, top_k, renormalize, out_dtype)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(out_dtype), ids


def route_grouped(
    logits: torch.Tensor,
    correction: torch.Tensor,
    top_k: int,
    num_groups: int,
    topk_groups: int,
    renormalize: bool,
    scale: float,
    scoring: str = "sigmoid",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] float32, ids [T, k]) from float32 router logits [T, E]: sigmoid
    scores; each group of E / num_groups experts is ranked by the sum of its two best
    corrected scores (score + correction [E]); the topk_groups best groups' experts are
    eligible, and the k best corrected scores among them are chosen. Their uncorrected
    scores are the weights, renormalised (over their sum + 1e-20) when asked, then scaled.
    `scoring` "softmax" (DeepSeek-V2): softmax scores, no correction (None), a group
    ranked by its best score. Device ops only (no host sync), so it is captured in CUDA
    graphs as it is."""
    softmax = scoring == "softmax"
    scores = torch.softmax(logits.float(), dim=-1) if softmax else logits.float().sigmoid()
    choice = scores if correction is None else scores + correction
    tokens, experts = choice.shape
    if num_groups > 1:
        grouped = choice.view(tokens, num_groups, experts // num_groups)
        if softmax:
            group_scores = grouped.max(dim=-1).values
        else:
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
        keep = group_scores.topk(topk_groups, dim=-1, sorted=False).indices
        eligible = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
        eligible = eligible[:, :, None].expand_as(grouped).reshape(tokens, experts)
        choice = choice.masked_fill(~eligible, float("-inf"))
    ids = choice.topk(top_k, dim=-1, sorted=False).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * scale, ids


class Router(nn.Module):
    """hidden [T, H] -> expert logits [T, E]. `bias`: the product's bias (GPT-OSS);
    `float32`: weight and product in float32 (DeepSeek, GLM-4.5 keep their routers in
    float32); `correction`: with `e_score_correction_bias` [E] for route_grouped's sigmoid
    scoring."""

    def __init__(
        self, hidden: int, num_experts: int, bias: bool, float32: bool, correction: bool = False
    ) -> None:
        super().__init__()
        dtype = torch.float32 if float32 else None
        self.float32 = float32
        self.weight = nn.Parameter(torch.empty(num_experts, hidden, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(num_experts, dtype=dtype)) if bias else None
        self.e_score_correction_bias = None
        if correction:  # (zeros until loaded)
            self.e_score_correction_bias = nn.Parameter(torch.zeros(num_experts, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float() if self.float32 else x, self.weight, self.bias)


class FusedExperts(nn.Module):
    # checkpoint piece -> (our stacked weight, which half of w13; None: all of w2)
    PIECES: dict[str, tuple[str, int | None]] = {
        "w1": ("w13", 0),
        "gate_proj": ("w13", 0),
        "w3": ("w13", 1),
        "up_proj": ("w13", 1),
        "w2": ("w2", None),
        "down_proj": ("w2", None),
    }

    def __init__(
        self,
        num_experts: int,
        hidden: int,
        intermediate: int,
        bias: bool = False,
        clamped_swiglu: tuple[float, float] | None = None,
        stacked_layout: str = "rows",
    ) -> None:
        super().__init__()
        if stacked_layout not in ("rows", "gpt_oss"):
            raise ValueError(f"unknown stacked expert layout {stacked_layout!r}")
        self.quant_method = current_method().experts()  # raises for formats without experts
        tp = get_tp()
        self.num_experts = num_experts  # the model's, every rank's together
        if expert_parallel():  # whole experts per rank
            self.num_local = divide(num_experts, tp.size, "the number of experts")
            self.first_expert = tp.rank * self.num_local
            self.local, self.start = intermediate, 0
        else:  # every expert, I / tp of its columns per rank
            self.num_local, self.first_expert = num_experts, 0
            self.local = divide(intermediate, tp.size, "moe_intermediate_size")
            self.start = tp.rank * self.local
        self.hidden = hidden
        self.w13_scale = self.w2_scale = None  # float32 [E, rows], quantized formats only
        self.w13_bias = self.w2_bias = None
        if bias:  # (zeros until loaded: what dummy weights keep)
            self.w13_bias = nn.Parameter(torch.zeros(self.num_local, 2 * self.local))
            self.w2_bias = nn.Parameter(torch.zeros(self.num_local, hidden))
        self.clamped_swiglu = clamped_swiglu
        self.act = SiluAndMul() if clamped_swiglu is None else ClampedSwigluAndMul(*clamped_swiglu)
        self.stacked_layout = stacked_layout
        # w13_weight [E, 2 * I, H] and w2_weight [E, H, I], or what the format keeps instead
        self.quant_method.create_weights(self, self.num_local, self.local, hidden)
        self._loaded: set[tuple[str, int | None, int]] = set()  # (weight, half, expert)

    def load_expert(self, piece: str, source, expert: int) -> None:
        """Expert `expert`'s checkpoint weight `piece` (a tensor or safetensors slice of the
        whole expert), this rank's columns of it; another rank's expert is skipped."""
        if piece not in self.PIECES or not 0 <= expert < self.num_experts:
            raise ValueError(f"unexpected expert weight {piece!r} of expert {expert}")
        if not 0 <= expert - self.first_expert < self.num_local:
            return
        name, half = self.PIECES[piece]
        lo, hi = self.start, self.start + self.local
        self._fill((name, half), source[:, lo:hi] if half is None else source[lo:hi], expert)

    STACKED = (
        "gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias", "gate_proj", "up_proj"
    )  # fmt: skip

    def load_stacked(self, piece: str, source) -> None:
        """Every expert in one tensor (a tensor or a safetensors slice: only this rank's
        experts are read). `stacked_layout` "rows", transformers 5's: `gate_up_proj`
        [E, 2I, H] (gate rows, then up), `down_proj` [E, H, I], or a GGUF file's gate and
        up apart (`gate_proj`, `up_proj`: [E, I, H]); "gpt_oss": `gate_up_proj` [E, H, 2I]
        with gate and up in alternate columns, `down_proj` [E, I, H], and the biases
        `gate_up_proj_bias` [E, 2I] (alternating too) and `down_proj_bias` [E, H]."""
        shape = shape_of(source)
        is_bias = piece.endswith("_bias")
        stacked = len(shape) == (2 if is_bias else 3) and shape[0] == self.num_experts
        if not stacked or piece not in self.STACKED or (is_bias and self.w2_bias is None):
            raise ValueError(f"unexpected stacked expert weight {piece!r} of shape {shape}")
        lo, hi = self.start, self.start + self.local
        gpt_oss = self.stacked_layout == "gpt_oss"
        for expert in range(self.first_expert, self.first_expert + self.num_local):
            if piece == "down_proj_bias":
                # Summed over the ranks' column shares: only the first rank adds it (under
                # expert parallelism each rank holds whole experts, and start is 0).
                bias = source[expert]
                self._fill(("w2_bias", None), bias if lo == 0 else torch.zeros_like(bias), expert)
                continue
            if piece == "down_proj":  # "rows": [E, H, I]; "gpt_oss": [E, I, H]
                rows = source[expert, lo:hi].t() if gpt_oss else source[expert, :, lo:hi]
                self._fill(("w2", None), rows, expert)
                continue
            if piece in ("gate_proj", "up_proj") and not gpt_oss:  # [E, I, H] each
                self._fill(("w13", int(piece == "up_proj")), source[expert, lo:hi], expert)
                continue
            name = "w13_bias" if is_bias else "w13"
            if gpt_oss:  # gate in even columns, up in odd ones: this rank's are [2 lo, 2 hi)
                mine = (
                    source[expert, 2 * lo : 2 * hi]
                    if is_bias
                    else source[expert, :, 2 * lo : 2 * hi].t()
                )
                self._fill((name, 0), mine[0::2], expert)
                self._fill((name, 1), mine[1::2], expert)
                continue
            whole = shape[1] // 2  # gate rows, then up (a bias [E, 2I] alike)
            self._fill((name, 0), source[expert, lo:hi], expert)
            self._fill((name, 1), source[expert, whole + lo : whole + hi], expert)

    def _fill(self, part: tuple[str, int | None], rows, expert: int) -> None:
        """Copy this rank's rows of one expert's gate (w13, 0), up (w13, 1) or down (w2,
        None) weight, or of their biases (w13_bias, w2_bias), shape-checked."""
        name, half = part
        expected = {
            ("w13", 0): (self.local, self.hidden),
            ("w13", 1): (self.local, self.hidden),
            ("w2", None): (self.hidden, self.local),
            ("w13_bias", 0): (self.local,),
            ("w13_bias", 1): (self.local,),
            ("w2_bias", None): (self.hidden,),
        }[part]
        if tuple(rows.shape) != expected:
            what = {0: "gate", 1: "up", None: "down"}[half]
            what += " bias" if name.endswith("bias") else ""
            raise ValueError(
                f"expert {expert} {what}: checkpoint shape {tuple(rows.shape)} does not fit "
                f"{expected}"
            )
        self.quant_method.store(self, part, expert - self.first_expert, rows)
        self._loaded.add((name, half, expert))

    def missing(self) -> list[str]:
        """This rank's expert weights the checkpoint did not give (after loading)."""
        parts = {("w13", 0): "gate", ("w13", 1): "up", ("w2", None): "down"}
        if self.w2_bias is not None:
            parts.update({("w13_bias", 0): "gate bias", ("w13_bias", 1): "up bias"})
            parts[("w2_bias", None)] = "down bias"
        mine = range(self.first_expert, self.first_expert + self.num_local)
        return [
            f"expert {e} {what}"
            for e in mine
            for (name, half), what in parts.items()
            if (name, half, e) not in self._loaded
        ]

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """This rank's share of sum_k weights[t, k] * expert[ids[t, k]](x[t]), [T, H] in
        x's dtype; `weights` in the dtype the products are scaled in. On CUDA: the Triton
        grouped GEMMs (cadence/ops/fused_moe.py), which never wait on the host."""
        if x.is_cuda:
            from cadence.ops import fused_moe

            return fused_moe.fused_experts(
                x,
                self.w13_weight,
                self.w2_weight,
                ids,
                weights,
                self.w13_scale,
                self.w2_scale,
                self.first_expert,
                global_experts=self.num_experts,
                w13_bias=self.w13_bias,
                w2_bias=self.w2_bias,
                clamped=self.clamped_swiglu,
            )
        return self.quant_method.forward_cpu(self, x, ids, weights)

    def forward_routed(
        self,
        x: torch.Tensor,
        logits: torch.Tensor,
        top_k: int,
        renormalize: bool,
        weight_dtype: torch.dtype,
    ) -> torch.Tensor:
        """forward() after route(logits, top_k, renormalize, weight_dtype). On CUDA, experts
        without biases may route inside their kernels (fused_moe.fused_experts_routed)."""
        if x.is_cuda and self.w13_bias is None and self.clamped_swiglu is None:
            from cadence.ops import fused_moe

            return fused_moe.fused_experts_routed(
                x, logits, top_k, renormalize, weight_dtype, self.w13_weight, self.w2_weight,
                self.w13_scale, self.w2_scale, self.first_expert, self.num_experts,
            )  # fmt: skip
        weights, ids = route(logits, top_k, renormalize, weight_dtype)
        return self.forward(x, ids, weights)

    def forward_reference(
        self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """forward() in torch: the (token, slot) pairs sorted by expert, the MLPs of this
        rank's experts that got any on their tokens (the format's `expert_mlp`: a GEMM
        pair each), and each token's outputs summed by weight in expert order (the number
        of tokens each expert got is read on the host)."""
        top_k = ids.shape[1]
        # Grouped on the host with numpy: a few microseconds a call at a decode step's
        # handful of pairs, where the same torch ops cost ~0.2 ms a layer.
        flat = ids.flatten().cpu().numpy().astype(np.int64) - self.first_expert
        flat = np.where((flat >= 0) & (flat < self.num_local), flat, self.num_local)
        order = np.argsort(flat, kind="stable")  # (token, slot) pairs grouped by expert
        counts = np.bincount(flat, minlength=self.num_local + 1)[: self.num_local]
        out = torch.zeros_like(x)
        experts = np.flatnonzero(counts).tolist()  # (ids past num_local: other ranks')
        if not experts:
            return out
        sizes = counts[experts].tolist()
        order = order[: sum(sizes)]
        pairs = torch.from_numpy(order).to(x.device)
        tokens = torch.from_numpy(order // top_k).to(x.device)
        rows = x.index_select(0, tokens).split(sizes)
        mlp = self.quant_method.expert_mlp
        h = torch.cat([mlp(self, expert, block) for expert, block in zip(experts, rows)])
        h = h * weights.flatten().index_select(0, pairs)[:, None]
        return out.index_add_(0, tokens, h.to(out.dtype))


class SparseMoE(nn.Module):
    """The block a mixture-of-experts layer has in place of its MLP. Unlike a dense MLP
    it takes the normed hidden state itself ([T, H]), not a projection of it."""

    def __init__(self, config, options: MoEOptions) -> None:
        super().__init__()
        if options.clamped_swiglu is None and activation_of(config) not in ("silu", "swish"):
            raise ValueError(f"experts with {activation_of(config)!r} are not supported yet")
        hidden = config.hidden_size
        self.options = options
        if options.scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"unknown expert scoring {options.scoring!r}")
        sigmoid = options.scoring == "sigmoid"
        # On a CPU the router's product is float32 too: oneDNN's bf16 GEMM is a reference
        # loop on CPUs without bf16 instructions (126 us for a 64 x 1,024 router at one row).
        on_cpu = torch.get_default_device().type == "cpu"
        float32 = sigmoid or options.float32_router or on_cpu
        self.gate = Router(hidden, options.num_experts, options.router_bias, float32, sigmoid)
        self.experts = FusedExperts(
            options.num_experts,
            hidden,
            options.intermediate_size,
            bias=options.expert_bias,
            clamped_swiglu=options.clamped_swiglu,
            stacked_layout=options.stacked_layout,
        )
        self.shared_expert = self.shared_expert_gate = None
        if options.shared_intermediate_size:
            shared = SimpleNamespace(
                hidden_size=hidden,
                intermediate_size=options.shared_intermediate_size,
                hidden_act="silu",
            )
            self.shared_expert = GatedMLP(shared)
            if options.shared_gate:
                self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)

    def forward(self, x: torch.Tensor, logits: torch.Tensor | None = None) -> torch.Tensor:
        """The block's output for the normed hidden state x [T, H]; `logits`: the router's
        product of x where the caller already has it (models/fused.py norm_router)."""
        opts = self.options
        dtype = torch.float32 if opts.float32_weights else x.dtype
        if logits is None:
            logits = self.gate(x)
        if opts.plain_topk:
            out = self.experts.forward_routed(x, logits, opts.top_k, opts.renormalize, dtype)
        else:
            weights, ids = route_grouped(
                logits,
                self.gate.e_score_correction_bias,
                opts.top_k,
                opts.num_groups,
                opts.topk_groups,
                opts.renormalize,
                opts.routed_scale,
                opts.scoring,
            )
            out = self.experts(x, ids, weights.to(dtype))
        out = all_reduce(out)
        if self.shared_expert is not None:
            shared = self.shared_expert(self.shared_expert.gate_up_proj(x))
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return out
