"""The integer packing formats int8, int4 and uint1: the quantization rule, exact scores against a float64
reference on the stored values for every available family, sizes, round trips and bad input.

The reference re-implements the packing rule in NumPy (scale = float32(max|x| / 127 or 7), q = round half
to even of x / scale, clipped; uint1 keeps the sign, zero counting as +1) and never reads numkong's
buffers, so a packer bug and a kernel bug both show.
"""
import math
import pickle

import numpy as np
import pytest

import numkong as nk
from conftest import FAMILY_PARAMS, assert_score_close, random_matrix

INTEGER = ["int8", "int4", "uint1"]
LIMIT = {"int8": 127.0, "int4": 7.0}
DEPTHS = [1, 3, 17, 129, 1000, 4100]
SHAPES = [(1, 1), (1, 37), (9, 1), (33, 70)]


def quantized(x, name):
    """(q as float64, per-row scale) of float input x, as the packer stores it."""
    x = np.asarray(x, dtype=np.float64)
    if name == "uint1":
        return np.where(x >= 0, 1.0, -1.0), np.ones(x.shape[0])
    absmax = np.abs(x).max(axis=1)
    scale = (absmax / LIMIT[name]).astype(np.float32).astype(np.float64)
    multiplier = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale > 0)
    q = np.clip(np.rint(x * multiplier[:, None]), -LIMIT[name], LIMIT[name])
    return q, scale


def stored(x, name):
    q, scale = quantized(x, name)
    return q * scale[:, None]


def reference(queries, documents, name):
    """float64 MaxSim of the dequantized stored values."""
    q, d = stored(queries, name), stored(documents, name)
    nq, nd = np.linalg.norm(q, axis=1), np.linalg.norm(d, axis=1)
    cos = (q @ d.T) / np.where(nq > 0, nq, 1)[:, None] / np.where(nd > 0, nd, 1)[None, :]
    best = np.where(nq > 0, cos.max(axis=1), -1.0)  # a zero query row contributes 1
    return math.fsum(np.maximum(0.0, 1.0 - best))


def shapes_and_depths():
    for depth in DEPTHS:
        for nq, nd in SHAPES:
            if depth > 1000 and nq * nd > 100:
                continue  # serial walks the tiled layout element by element: keep the large depths small
            yield pytest.param(nq, nd, depth, id=f"{nq}x{nd}x{depth}")


@pytest.mark.parametrize("name", INTEGER)
@pytest.mark.parametrize("nq, nd, depth", list(shapes_and_depths()))
@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_exact_on_the_stored_values(name, nq, nd, depth, family):
    x = random_matrix(nq, depth, 1)
    y = random_matrix(nd, depth, 2)
    q, d = nk.maxsim_pack(x, name), nk.maxsim_pack(y, name)
    got = nk.maxsim_packed(q, d, capabilities=family)
    assert_score_close(got, reference(x, y, name), 1e-12, f"{name} {family.name.lower()}")
    assert got == nk.maxsim_packed(q, d, capabilities=nk.Capability.SERIAL)  # the same bits as serial


@pytest.mark.parametrize("name", INTEGER)
def test_every_family_agrees_bit_for_bit_on_blocks_and_tails(name):
    """More documents than one block (512) and a partial last tile, 8-row groups plus a remainder."""
    x, y = random_matrix(19, 200, 3), random_matrix(1043, 200, 4)
    q, d = nk.maxsim_pack(x, name), nk.maxsim_pack(y, name)
    scores = {cap: nk.maxsim_packed(q, d, capabilities=cap) for cap in nk.Capability if cap & nk.get_capabilities()}
    assert len(set(scores.values())) == 1, scores
    assert_score_close(scores[nk.Capability.SERIAL], reference(x, y, name), 1e-12, name)


@pytest.mark.parametrize("name", INTEGER)
def test_a_wrong_best_document_would_fail(name):
    """Near-ties: every document row is the query plus a tiny perturbation; only one is the best."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 96))
    y = np.repeat(x[:1], 60, axis=0) + 0.05 * rng.standard_normal((60, 96))
    q, d = nk.maxsim_pack(x, name), nk.maxsim_pack(y, name)
    expected = reference(x, y, name)
    for cap in nk.Capability:
        if cap & nk.get_capabilities():
            assert_score_close(nk.maxsim_packed(q, d, capabilities=cap), expected, 1e-12, f"{name} {cap}")
    # The runner-up's score differs from the best's by far more than the tolerance.
    qs, ds = stored(x, name), stored(y, name)
    cos = np.sort((qs[0] @ ds.T) / np.linalg.norm(qs[0]) / np.linalg.norm(ds, axis=1))
    assert cos[-1] - cos[-2] > 1e-9 or cos[-1] == cos[-2]


@pytest.mark.parametrize("name", INTEGER)
@pytest.mark.parametrize("nq, nd, depth", [
    (8, 63, 128), (9, 63, 128), (8, 64, 128), (16, 64, 128), (17, 63, 128), (17, 64, 128), (17, 65, 128),
    (32, 64, 64), (33, 65, 56), (40, 130, 768), (40, 130, 776), (20, 200, 72)])
def test_every_family_agrees_where_the_amx_paths_change(name, nq, nd, depth):
    """Around the AMX family's choices for int8 / int4 (the VNNI kernel up to 8 query rows against fewer
    than 64 documents, int4's tiles from 17 rows and 64 documents at padded depths 64-768, every cosine
    exact in blocks of at most 64 documents): the same bits on every family, and the reference's score."""
    x, y = random_matrix(nq, depth, 21), random_matrix(nd, depth, 22)
    q, d = nk.maxsim_pack(x, name), nk.maxsim_pack(y, name)
    scores = {cap: nk.maxsim_packed(q, d, capabilities=cap) for cap in nk.Capability if cap & nk.get_capabilities()}
    assert len(set(scores.values())) == 1, scores
    assert_score_close(scores[nk.Capability.SERIAL], reference(x, y, name), 1e-12, f"{name} {nq}x{nd}x{depth}")


@pytest.mark.parametrize("name", INTEGER)
def test_equal_and_nearly_equal_documents_in_one_block(name):
    """Documents repeated 16 rows apart (the same lane of different 16-row tiles, which the AMX int8
    epilogue keeps only the best of) and near copies of the query rows, with 32 query rows and a
    1,030-document matrix: the tied and nearly tied bests must give the exact score on every family."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((32, 128))
    base = rng.standard_normal((16, 128))
    y = np.tile(base, (65, 1))[:1030].copy()  # row j equals row j + 16
    y[100:132] = x + 1e-3 * rng.standard_normal((32, 128))  # a near copy of every query row
    y[500:532] = y[100:132]  # and that copy again, 400 rows on: the same lanes
    y[700:732] = x + 2e-3 * rng.standard_normal((32, 128))  # a runner-up close behind
    q, d = nk.maxsim_pack(x, name), nk.maxsim_pack(y, name)
    expected = reference(x, y, name)
    scores = {cap: nk.maxsim_packed(q, d, capabilities=cap) for cap in nk.Capability if cap & nk.get_capabilities()}
    assert len(set(scores.values())) == 1, scores
    assert_score_close(scores[nk.Capability.SERIAL], expected, 1e-12, name)


def test_uint1_cosine_is_depth_minus_twice_hamming():
    rng = np.random.default_rng(6)
    depth = 77
    x, y = rng.standard_normal((5, depth)), rng.standard_normal((11, depth))
    bits_x, bits_y = x >= 0, y >= 0
    hamming = (bits_x[:, None, :] != bits_y[None, :, :]).sum(axis=2)
    expected = math.fsum(np.maximum(0.0, 1.0 - (depth - 2 * hamming.min(axis=1)) / depth))
    assert nk.maxsim(x, y, "uint1") == pytest.approx(expected, rel=1e-14)
    # Bool input: True is +1, False -1.
    assert nk.maxsim(bits_x, bits_y, "uint1") == nk.maxsim(x, y, "uint1")
    # Zero counts as +1.
    zeros = np.zeros((1, depth))
    assert nk.maxsim(zeros, np.ones((1, depth)), "uint1") == 0.0


def test_int8_input_is_stored_bit_exact():
    rng = np.random.default_rng(7)
    x = rng.integers(-127, 128, size=(20, 33), dtype=np.int8)
    corpus = nk.maxsim_pack_corpus([x], dtype="int8")
    np.testing.assert_array_equal(corpus.document(0), x.astype(np.float64))  # scale 1, q = x
    y = rng.integers(-127, 128, size=(9, 33), dtype=np.int8)
    xf, yf = x.astype(np.float64), y.astype(np.float64)
    cos = (xf @ yf.T) / np.linalg.norm(xf, axis=1)[:, None] / np.linalg.norm(yf, axis=1)[None, :]
    expected = math.fsum(np.maximum(0.0, 1.0 - cos.max(axis=1)))
    assert_score_close(nk.maxsim(x, y, "int8"), expected, 1e-12, "int8 input")


def test_int8_input_holding_minus_128_names_the_row():
    x = np.zeros((4, 8), dtype=np.int8)
    x[2, 5] = -128
    with pytest.raises(ValueError, match="row 2 holds -128"):
        nk.maxsim_pack(x, "int8")


@pytest.mark.parametrize("name", INTEGER)
def test_dequantized_values_follow_the_rule(name):
    x = random_matrix(13, 45, 8)
    corpus = nk.maxsim_pack_corpus([x], dtype=name)
    np.testing.assert_array_equal(corpus.document(0), stored(x, name))


@pytest.mark.parametrize("name", ["int8", "int4"])
def test_rows_far_outside_float32_range_are_scaled_first(name):
    """A row whose scale would be subnormal or overflow float32 is scaled by a power of two (cosine is
    scale-free): its codes and its score are those of the row brought into range."""
    rng = np.random.default_rng(9)
    base = rng.standard_normal((3, 40))
    tiny, huge = base * 1e-300, base * 1e300
    for x in (tiny, huge):
        assert nk.maxsim(x, base, name) == nk.maxsim(base, base, name)
    # Subnormal float64 rows (2^-exponent overflowed a double here once, storing garbage codes):
    # integers times 2^-k are exact down to 2^-1074, so the scaled rows hold the same values.
    whole = rng.integers(-1000, 1001, (3, 40)).astype(np.float64)
    for k in (1032, 1040, 1064):
        assert nk.maxsim(np.ldexp(whole, -k), whole, name) == nk.maxsim(whole, whole, name), k


@pytest.mark.parametrize("name", INTEGER)
def test_zero_rows(name):
    x = np.zeros((3, 16))
    x[1] = 1.0
    y = np.zeros((2, 16))
    y[0, :4] = 1.0
    got = nk.maxsim(x, y, name)
    if name == "uint1":  # no zero rows: every value is +1
        assert got == pytest.approx(0.0)
    else:  # zero query rows contribute 1; the zero document row has cosine 0
        assert got == pytest.approx(2.0 + (1.0 - 0.5))


@pytest.mark.parametrize("name, limit", [("int8", 140), ("int4", 80), ("uint1", 24)])
def test_sizes_at_depth_128(name, limit):
    size = nk.MaxSimPackedMatrix.pack_size(1024, 128, dtype=name)
    assert size / 1024 <= limit
    packed = nk.maxsim_pack(random_matrix(1024, 128, 10), name)
    assert packed.nbytes == size and packed.dtype == name


@pytest.mark.parametrize("name", INTEGER)
def test_pickle_and_file_round_trips(name, tmp_path):
    x, y = random_matrix(10, 50, 11), random_matrix(30, 50, 12)
    q, d = nk.maxsim_pack(x, name), nk.maxsim_pack(y, name)
    again = pickle.loads(pickle.dumps(d, protocol=5))
    assert again.dtype == name and bytes(memoryview(again)) == bytes(memoryview(d))
    assert nk.maxsim_packed(q, again) == nk.maxsim_packed(q, d)
    corpus = nk.maxsim_pack_corpus([y, x], dtype=name)
    path = tmp_path / "corpus.nkc"
    corpus.save(path)
    loaded = nk.MaxSimPackedCorpus.load(path, verify="all")
    np.testing.assert_array_equal(nk.maxsim_packed_corpus(q, loaded), [nk.maxsim_packed(q, d),
                                                                       nk.maxsim_packed(q, q)])
    ids, scores = nk.maxsim_packed_corpus(q, loaded, top_k=1)
    assert ids.tolist() == [1]


@pytest.mark.parametrize("name, offset, byte", [
    ("int8", 128 + 2 * 12 + 3, 0x00),  # word 2 of row 0 (3 rows: words 12 bytes apart), depth 11: padding
    ("int4", 128 + 1 * 12 + 3, 0x00),  # word 1, byte 3: depths 11 and 15, padding, now the invalid code -8
    ("uint1", 128 + 3, 0xFF),          # word 0, bits 24..31: padding past depth 10
])
def test_corrupt_codes_do_not_load(name, offset, byte):
    packed = nk.maxsim_pack(random_matrix(3, 10, 13), name)
    data = bytearray(memoryview(packed))
    loader, _ = packed.__reduce_ex__(5)  # what pickle.loads calls
    assert loader(bytes(data)).nbytes == packed.nbytes
    data[offset] = byte
    with pytest.raises(ValueError, match="corrupt"):
        loader(bytes(data))


def test_depth_limit_is_explained():
    with pytest.raises(ValueError, match="int8 packs depth up to 262,144"):
        nk.MaxSimPackedMatrix.pack_size(1, 262145, dtype="int8")
    assert nk.MaxSimPackedMatrix.pack_size(1, 262145, dtype="uint1") > 0


def test_mixed_formats_are_refused():
    q = nk.maxsim_pack(random_matrix(2, 8, 14), "int8")
    d = nk.maxsim_pack(random_matrix(2, 8, 15), "int4")
    with pytest.raises(TypeError, match="int8.*int4"):
        nk.maxsim_packed(q, d)
