"""Every packed form reads back through ONNX Runtime as the format's real-valued weights.

Reference: tests/quant_reference.py, llama.cpp's dequantize_row_* transcribed as scalar float64 loops apart from the
packer, giving each weight's two exact terms (main, offset). The packed operands are read back through the real
kernels with one-hot rows at accuracy level 0 (MatMulNBits for the main term; the block sums' MatMul for the
offset), so the test sees what a pass computes, not what the packer meant. A second reference, gguf-py's
`dequantize`, rounds main + offset to float32: the readback agrees with it within half an ulp.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gg_dequantize
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from kernels.qmatmul import SCALE_AT
from models import quant
from tests.quant_reference import BLOCK_BYTES, weight_terms

MS = "com.microsoft"
TYPES = list(quant.FORMS)
EXACT_TYPES = [t for t in TYPES if t != "Q4_1"]     # Q4_1's offset 8d + m is rounded to float32 (models/quant.py)
PER_BLOCK = {t: quant.BLOCK_WEIGHTS[t] for t in TYPES}
EXTREME_F16 = [65504.0, -65504.0, 2.0 ** -24, -(2.0 ** -24), 2.0 ** -14, 0.0, -0.0, 1.0, 0.000123, -3.5]


def readback(p: quant.Packed, n_out: int, k_in: int) -> tuple[np.ndarray, np.ndarray]:
    """(main, offset) [N, K] as ONNX Runtime computes them from the packed operands, one one-hot row per weight."""
    f = p.form
    inits = [numpy_helper.from_array(p.packed, "B"), numpy_helper.from_array(p.scales, "s")]
    mm_in = ["x", "B", "s"]
    if p.zero_points is not None:
        inits.append(numpy_helper.from_array(p.zero_points.reshape(-1), "z"))
        mm_in.append("z")
    nodes = [helper.make_node("MatMulNBits", mm_in, ["main"], domain=MS, K=k_in, N=n_out, bits=f.bits,
                              block_size=f.block, accuracy_level=0)]
    outputs = [helper.make_tensor_value_info("main", TensorProto.FLOAT, [1, k_in, n_out])]
    if p.offsets is not None:
        inits += [numpy_helper.from_array(p.offsets, "o"),
                  numpy_helper.from_array(np.array([1, k_in, k_in // f.block, f.block], np.int64), "shape"),
                  numpy_helper.from_array(np.array([-1], np.int64), "axis")]
        nodes += [helper.make_node("Reshape", ["x", "shape"], ["blocks"]),
                  helper.make_node("ReduceSum", ["blocks", "axis"], ["sums"], keepdims=0),
                  helper.make_node("MatMul", ["sums", "o"], ["offset"])]
        outputs.append(helper.make_tensor_value_info("offset", TensorProto.FLOAT, [1, k_in, n_out]))
    graph = helper.make_graph(nodes, "readback", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                               [1, k_in, k_in])], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    got = sess.run(None, {"x": np.eye(k_in, dtype=np.float32)[None]})
    main = got[0][0].T.astype(np.float64)
    offset = got[1][0].T.astype(np.float64) if p.offsets is not None else np.zeros_like(main)
    return main, offset


def with_scales(raw: np.ndarray, qtype: str, values) -> np.ndarray:
    """raw blocks [n, bytes] with each block's float16 scale fields set from `values` (cycled)."""
    raw = raw.copy()
    it = iter(values)
    for blk in raw:
        for at in SCALE_AT[qtype]:
            blk[at:at + 2] = np.frombuffer(np.float16(next(it)).tobytes(), np.uint8)
    return raw


def check_exact(raw: np.ndarray, qtype: str, n_out: int, k_in: int) -> None:
    main_ref, off_ref = (np.array(x) for x in weight_terms(raw.tobytes(), qtype, n_out, k_in))
    main, offset = readback(quant.pack(raw, qtype, n_out, k_in), n_out, k_in)
    if qtype == "Q4_1":                       # d*(q-8) exact; the offset 8d + m rounded once to float32
        assert np.all(np.abs(main + offset - (main_ref + off_ref)) <= np.spacing(np.abs(offset).astype(np.float32)))
        return
    np.testing.assert_array_equal(main, main_ref, err_msg=f"{qtype}: scale x (code - zero point)")
    np.testing.assert_array_equal(offset, off_ref, err_msg=f"{qtype}: the per-block offset")


def random_blocks(rng: np.random.Generator, qtype: str, n_blocks: int) -> np.ndarray:
    raw = rng.integers(0, 256, (n_blocks, BLOCK_BYTES[qtype]), dtype=np.uint8)
    return with_scales(raw, qtype, rng.standard_normal(2 * n_blocks) * 0.01)


@pytest.mark.parametrize("qtype", TYPES)
def test_packed_weights_read_back_as_the_formats_real_values(qtype):
    rng = np.random.default_rng(sum(map(ord, qtype)))
    n_out, per_row = 6, 2
    raw = random_blocks(rng, qtype, n_out * per_row)
    check_exact(raw, qtype, n_out, per_row * PER_BLOCK[qtype])


@pytest.mark.parametrize("qtype", TYPES)
def test_extreme_float16_scales_read_back_exactly(qtype):
    """Largest and smallest normal and subnormal float16 scales, signed zeros: every product stays exact."""
    rng = np.random.default_rng(1)
    n = len(EXTREME_F16) ** (len(SCALE_AT[qtype]))          # every pair of extremes where a block has two scales
    raw = rng.integers(0, 256, (n, BLOCK_BYTES[qtype]), dtype=np.uint8)
    pairs = [(a, b) for a in EXTREME_F16 for b in EXTREME_F16] if len(SCALE_AT[qtype]) == 2 else \
        [(a,) for a in EXTREME_F16]
    raw = with_scales(raw, qtype, [x for pair in pairs for x in pair])
    check_exact(raw, qtype, n, PER_BLOCK[qtype])


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K"])
def test_every_sub_block_scale_bit_pattern_reads_back_exactly(qtype):
    """Q4_K/Q5_K: 256 blocks whose twelve scale bytes all hold the block's index, so each of the eight 6-bit scales
    and mins takes all 64 values; Q6_K: 16 blocks whose sixteen int8 scales run through all 256 values."""
    rng = np.random.default_rng(2)
    if qtype == "Q6_K":
        raw = rng.integers(0, 256, (16, 210), dtype=np.uint8)
        raw[:, 192:208] = np.arange(256, dtype=np.uint8).reshape(16, 16)
    else:
        raw = rng.integers(0, 256, (256, BLOCK_BYTES[qtype]), dtype=np.uint8)
        raw[:, 4:16] = np.arange(256, dtype=np.uint8)[:, None]
    raw = with_scales(raw, qtype, rng.standard_normal(2 * len(raw)))
    check_exact(raw, qtype, len(raw), PER_BLOCK[qtype])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), qtype=st.sampled_from(TYPES))
def test_any_finite_blocks_read_back_as_the_formats_real_values(data, qtype):
    n_out, per_row = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 2))
    size = BLOCK_BYTES[qtype]
    raw = np.frombuffer(data.draw(st.binary(min_size=n_out * per_row * size, max_size=n_out * per_row * size)),
                        np.uint8).reshape(-1, size)
    finite = st.floats(allow_nan=False, allow_infinity=False, width=16) | st.sampled_from(EXTREME_F16)
    raw = with_scales(raw, qtype, data.draw(st.lists(finite, min_size=2 * len(raw), max_size=2 * len(raw))))
    check_exact(raw, qtype, n_out, per_row * PER_BLOCK[qtype])


@pytest.mark.parametrize("qtype", TYPES)
def test_packed_weights_agree_with_gguf_py_within_half_an_ulp(qtype):
    """gguf-py rounds main + offset to float32 once: the packed form's value is within half an ulp of its figure
    (Q4_1, whose offset is itself rounded: within one ulp)."""
    rng = np.random.default_rng(3)
    n_out, per_row = 8, 2
    k_in = per_row * PER_BLOCK[qtype]
    raw = random_blocks(rng, qtype, n_out * per_row)
    main, offset = readback(quant.pack(raw, qtype, n_out, k_in), n_out, k_in)
    theirs = gg_dequantize(raw, GGMLQuantizationType[qtype]).reshape(n_out, k_in).astype(np.float32)
    bound = np.spacing(np.abs(theirs)).astype(np.float64) * (1.0 if qtype == "Q4_1" else 0.5)
    assert np.all(np.abs(main + offset - theirs) <= bound)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_a_non_finite_scale_is_refused_naming_the_tensor(qtype, bad):
    rng = np.random.default_rng(4)
    raw = random_blocks(rng, qtype, 4)
    at = SCALE_AT[qtype][-1]
    raw[2, at:at + 2] = np.frombuffer(np.float16(bad).tobytes(), np.uint8)
    with pytest.raises(quant.QuantError, match=r"blk\.3\.ffn_down\.weight.*row 1, block"):
        quant.pack(raw, qtype, 2, 2 * PER_BLOCK[qtype], name="blk.3.ffn_down.weight")


def test_every_form_fits_matmulnbits_and_states_why_it_is_exact():
    """bits 4 or 8, a power-of-two block >= 16 (ONNX Runtime 1.32's CPU kernel); codes - zero point span the
    format's integers."""
    for qtype, form in quant.FORMS.items():
        assert form.bits in (4, 8) and form.block in (16, 32), qtype
        assert qtype in quant.__doc__, f"{qtype}: the module's table states its form and why it is exact"


def test_q4_k_zero_points_pack_two_blocks_per_byte():
    raw = random_blocks(np.random.default_rng(5), "Q4_K", 3)
    p = quant.pack(raw, "Q4_K", 1, 3 * 256)
    assert p.zero_points.shape == (1, 12) and not p.zero_points.any()       # 24 blocks of 32, zero point 0
