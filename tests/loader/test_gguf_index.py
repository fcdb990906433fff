"""The GGUF index reads what gguf-py's reader reads (tensor names, types, shapes, bytes;
scalar metadata) without materialising metadata arrays, and refuses what is not GGUF."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from cadence.loader.gguf_index import GgufIndex


def write_file(path, alignment: int | None = None) -> None:
    writer = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_uint32("llama.block_count", 2)
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    writer.add_string("general.name", "tiny ünïcode")
    writer.add_array("tokenizer.ggml.tokens", [f"tok{i}" * (i % 5) for i in range(300)])
    writer.add_array("tokenizer.ggml.scores", [float(i) for i in range(300)])
    writer.add_array("nested", [[1, 2], [3]])
    writer.add_uint64("after.arrays", 2**40 + 7)
    rng = np.random.default_rng(0)
    writer.add_tensor("token_embd.weight", rng.standard_normal((8, 64), dtype=np.float32))
    writer.add_tensor("blk.0.attn_norm.weight", rng.standard_normal(64).astype(np.float16))
    q8 = gguf.quants.quantize(
        rng.standard_normal((4, 64), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0
    )
    writer.add_tensor("blk.0.ffn_up.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    bf16 = gguf.quants.quantize(
        rng.standard_normal((3, 32), dtype=np.float32), gguf.GGMLQuantizationType.BF16
    )
    writer.add_tensor("blk.1.ffn_down.weight", bf16, raw_dtype=gguf.GGMLQuantizationType.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("alignment", [None, 64])
def test_index_reads_what_gguf_py_reads(tmp_path, alignment):
    path = tmp_path / "tiny.gguf"
    write_file(path, alignment)
    theirs, ours = gguf.GGUFReader(str(path)), GgufIndex(path)
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(theirs.tensors, ours.tensors):
        assert b.tensor_type == a.tensor_type
        assert b.shape == tuple(a.shape.tolist())
        assert b.data.dtype == a.data.dtype and b.data.shape == a.data.shape
        assert np.array_equal(b.data, a.data), a.name
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            assert ours.scalar(key) is None  # arrays are stepped over, not kept
        else:
            assert ours.scalar(key) == field.contents(), key
    assert ours.scalar("general.name") == "tiny ünïcode"
    assert ours.scalar("after.arrays") == 2**40 + 7  # the walk past the arrays stayed in step
    ours.drop_resident_pages()  # the data stays readable: pages fault in again
    assert np.array_equal(ours.tensors[0].data, theirs.tensors[0].data)


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(ValueError, match="not a GGUF file"):
        GgufIndex(path)
