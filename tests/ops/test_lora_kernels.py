"""The Triton LoRA products (cadence/ops/lora_kernels.py) equal the torch path of
cadence/lora/batch.py: tokens of the base model left alone, slots with no token, one
token, runs longer than a tile, a slot's tokens scattered through the batch, widths that
are not tile multiples, and a reduction split over programs. On a CPU they run under
Triton's interpreter in a child process (TRITON_INTERPRET is read at import)."""

from __future__ import annotations

import pytest
import torch
from interpreter_helpers import check_all_under_interpreter

pytest.importorskip("triton", reason="triton is not installed")


def check_all(device: str) -> None:
    from cadence.lora.batch import LoRABatch

    torch.manual_seed(0)
    slots, k, n, r = 4, 200, 150, 32  # k, n: not multiples of the tiles
    cases = [(torch.float32, 1e-4), (torch.float16, 2e-2)]
    if device == "cuda":  # (the interpreter's tl.dot has no bf16)
        cases.append((torch.bfloat16, 5e-2))
    plans = [
        [2],  # one decode token
        [-1, -1, 0, -1],  # base tokens around one adapter token
        [1] * 37 + [-1] * 5 + [3] * 3,  # a run longer than a tile; slots 0 and 2 idle
        [0, 3, 0, -1, 3, 1, 0, 2, 2, -1, 1],  # scattered (a decode batch)
        [-1] * 9,  # no adapter: nothing changes
    ]
    for dtype, tol in cases:
        a = (torch.randn(slots, k, r, device=device) * 0.3).to(dtype)
        b = (torch.randn(slots, r, n, device=device) * 0.3).to(dtype)
        for token_slots in plans:
            t = len(token_slots)
            x = torch.randn(t, k, device=device, dtype=dtype)
            y = torch.randn(t, n, device=device, dtype=dtype)
            want = y.cpu().float().clone()
            for i, s in enumerate(token_slots):
                if s >= 0:
                    want[i] += (x[i].cpu().float() @ a[s].cpu().float()) @ b[s].cpu().float()
            batch = LoRABatch(slots, 64, torch.device(device), kernels=True)
            batch.plan(token_slots)
            got = y.clone()
            batch.add(got, x, a, b)  # (the Triton products)
            torch.testing.assert_close(got.cpu().float(), want, atol=tol * 10, rtol=tol)
            if dtype == torch.float32 and device == "cpu":  # the torch path: the same sums
                ref = y.clone()
                torch_path = LoRABatch(slots, 64, torch.device(device), kernels=False)
                torch_path.plan(token_slots)
                torch_path.add(ref, x, a, b)
                torch.testing.assert_close(ref, want, atol=1e-4, rtol=1e-4)


def test_lora_kernels_under_the_interpreter():
    check_all_under_interpreter("test_lora_kernels")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_lora_kernels_on_cuda():
    check_all("cuda")
