"""PyTorch CPU tensors in the formats ColBERT models store, read zero-copy through DLPack by maxsim,
maxsim_pack and maxsim_pack_corpus, and scored exactly on the stored values. Skipped without torch."""
import gc

import numpy as np
import pytest

import numkong as nk
from conftest import (
    AVAILABLE_FAMILIES,
    NUMPY_DTYPES,
    RTOL,
    assert_score_close,
    random_matrix,
    reference_maxsim,
)
from numkong._maxsim import _from_dlpack

pytestmark = pytest.mark.extras
torch = pytest.importorskip("torch")

# torch dtype name -> numkong packing dtype (what dtype=None keeps)
FORMATS = {"float64": "float64", "float32": "float32", "float16": "float16", "bfloat16": "bfloat16",
           "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}
FORMAT_PARAMS = [pytest.param(name, id=name) for name in FORMATS]


def tensor(rows, depth, seed, name):
    """A CPU tensor of format `name` from the float64 test data (rows scaled into the format's range)."""
    values = torch.from_numpy(np.array(random_matrix(rows, depth, seed)))
    if name.startswith("float8"):
        values = values * 16  # within e4m3's 448 and above both formats' subnormals for most entries
    return values.to(getattr(torch, name))


def as_numpy(t):
    """The same values as a NumPy / ml_dtypes array, without going through numkong (exact widening)."""
    return t.double().numpy().astype(NUMPY_DTYPES[FORMATS[str(t.dtype).removeprefix("torch.")]])


@pytest.mark.parametrize("name", FORMAT_PARAMS)
def test_from_dlpack_is_a_zero_copy_view(name):
    t = tensor(9, 17, 0, name)
    view = _from_dlpack(t)
    assert view.__array_interface__["data"][0] == t.data_ptr()
    assert view.dtype == NUMPY_DTYPES[FORMATS[name]] and view.shape == (9, 17)
    assert not view.flags.writeable
    assert view.tobytes() == as_numpy(t).tobytes()


def test_numpy_float_tensors_skip_the_dlpack_export(monkeypatch):
    # float16/32/64 CPU tensors are read through tensor.numpy() (a quarter of DLPack's cost); the
    # formats NumPy lacks still go through __dlpack__.
    exported = []
    original = torch.Tensor.__dlpack__

    def counting(self, *args, **kwargs):
        exported.append(self.dtype)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "__dlpack__", counting)
    for name in FORMATS:
        t = tensor(3, 8, 0, name)
        assert _from_dlpack(t).tobytes() == as_numpy(t).tobytes()
    assert exported == [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2]


def test_numpy_view_keeps_the_tensor_alive_and_read_only():
    t = tensor(64, 128, 2, "float32")
    expected = as_numpy(t).tobytes()
    view = _from_dlpack(t)
    with pytest.raises(ValueError):
        view[0, 0] = 1.0
    del t
    gc.collect()
    torch.randn(64, 128)  # reuse of freed memory would show below
    assert view.tobytes() == expected


def test_view_keeps_the_tensor_alive():
    t = tensor(64, 128, 1, "bfloat16")
    expected = as_numpy(t).tobytes()
    view = _from_dlpack(t)
    del t
    gc.collect()
    torch.randn(64, 128).to(torch.bfloat16)  # reuse of freed memory would show below
    assert view.tobytes() == expected


@pytest.mark.parametrize("name", FORMAT_PARAMS)
def test_maxsim_of_tensors_is_exact_on_the_stored_values(name):
    q, d = tensor(7, 33, 2, name), tensor(40, 33, 3, name)
    expected = reference_maxsim(as_numpy(q), as_numpy(d), FORMATS[name])
    for family in AVAILABLE_FAMILIES:
        assert_score_close(nk.maxsim(q, d, capabilities=family), expected, RTOL[FORMATS[name]],
                           f"{name} {family.name}")
    assert nk.maxsim(q, d) == nk.maxsim(as_numpy(q), as_numpy(d))


@pytest.mark.parametrize("name", FORMAT_PARAMS)
def test_maxsim_pack_keeps_the_format_and_packs_the_same_bytes(name):
    d = tensor(40, 33, 4, name)
    packed = nk.maxsim_pack(d)
    assert packed.dtype == FORMATS[name]
    assert bytes(memoryview(packed)) == bytes(memoryview(nk.maxsim_pack(as_numpy(d))))
    cast = nk.maxsim_pack(d, dtype="float32")
    assert bytes(memoryview(cast)) == bytes(memoryview(nk.maxsim_pack(as_numpy(d), dtype="float32")))


@pytest.mark.parametrize("name", FORMAT_PARAMS)
def test_maxsim_pack_corpus_of_tensors(name):
    documents = [tensor(n, 33, 10 + n, name) for n in (1, 5, 40)]
    q = tensor(7, 33, 5, name)
    corpus = nk.maxsim_pack_corpus(documents)
    assert corpus.dtype == FORMATS[name]
    assert bytes(memoryview(corpus)) == bytes(memoryview(nk.maxsim_pack_corpus([as_numpy(d) for d in documents])))
    scores = nk.maxsim_packed_corpus(nk.maxsim_pack(q), corpus)
    for score, document in zip(scores, documents):
        assert_score_close(float(score), reference_maxsim(as_numpy(q), as_numpy(document), FORMATS[name]),
                           RTOL[FORMATS[name]], name)
    tokens = torch.cat(documents)
    flat = nk.maxsim_pack_corpus(tokens, offsets=[0, 1, 6, 46])
    assert bytes(memoryview(flat)) == bytes(memoryview(corpus))


def test_row_strided_and_offset_views_are_read_in_place():
    base = tensor(30, 64, 6, "bfloat16")
    rows = base[3::4]  # storage offset and a row stride of 4 rows
    view = _from_dlpack(rows)
    assert view.__array_interface__["data"][0] == rows.data_ptr()
    assert view.strides == (4 * 64 * 2, 2)
    q = tensor(5, 64, 7, "bfloat16")
    expected = reference_maxsim(as_numpy(q), as_numpy(rows.contiguous()), "bfloat16")
    assert_score_close(nk.maxsim(q, rows), expected, RTOL["bfloat16"], "strided rows")


def test_depth_strided_and_transposed_tensors_are_refused():
    t = tensor(16, 32, 8, "float32")
    with pytest.raises(ValueError, match="not contiguous along depth"):
        nk.maxsim_pack(t[:, ::2])
    with pytest.raises(ValueError, match="not contiguous along depth"):
        nk.maxsim(t.T, t.T)


def test_tensor_that_requires_grad_is_read_through_detach():
    t = torch.randn(6, 16, requires_grad=True)
    view = _from_dlpack(t)
    assert view.__array_interface__["data"][0] == t.data_ptr()
    assert nk.maxsim(t, t * 1) == nk.maxsim(t.detach().numpy(), (t * 1).detach().numpy())


def test_lazily_negated_views_are_read_with_their_sign():
    t = torch.randn(6, 16, generator=torch.Generator().manual_seed(5))
    negated = torch._neg_view(t)
    assert negated.is_neg()
    assert nk.maxsim(negated, t) == nk.maxsim(-t, t)
    assert nk.maxsim(t, t) != nk.maxsim(-t, t)
    assert nk.maxsim_pack_corpus([negated]).document(0).tolist() == (-t).tolist()


def test_meta_device_is_refused_with_advice():
    meta = torch.empty(4, 8, device="meta")
    with pytest.raises(ValueError, match=r"meta.*move it to the CPU.*\.cpu\(\)"):
        nk.maxsim(meta, meta)
    with pytest.raises(ValueError, match=r"meta.*move it to the CPU"):
        nk.maxsim_pack_corpus([meta])


def test_cuda_device_is_refused_with_advice():
    class CudaTensor:  # what a CUDA tensor reports, without needing a GPU
        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, **kwargs):
            raise AssertionError("a CUDA tensor must not be exported")

    with pytest.raises(ValueError, match=r"queries is in cuda memory.*tensor\.cpu\(\)"):
        nk.maxsim(CudaTensor(), np.ones((2, 4), dtype=np.float32))
    with pytest.raises(ValueError, match=r"document 0 is in cuda memory"):
        nk.maxsim_pack_corpus([CudaTensor()])


def test_mixed_tensor_formats_pack_in_the_narrowest_common_format():
    q, d = tensor(4, 16, 9, "float16"), tensor(8, 16, 10, "bfloat16")
    expected = reference_maxsim(as_numpy(q), as_numpy(d), "float32")
    assert_score_close(nk.maxsim(q, d), expected, RTOL["float32"], "float16 x bfloat16")


def test_integer_tensor_needs_a_dtype():
    t = torch.arange(12, dtype=torch.int8).reshape(3, 4)
    with pytest.raises(TypeError, match="integer dtype"):
        nk.maxsim_pack(t)
    assert nk.maxsim_pack(t, dtype="float32").dtype == "float32"


def test_unpacked_scoring_reads_float32_tensors_in_place():
    from numkong._maxsim import _maxsim_unpacked
    rng = np.random.default_rng(31)
    query = rng.standard_normal((20, 24)).astype(np.float32)
    packed = nk.maxsim_pack(query)
    base = torch.from_numpy(rng.standard_normal((50, 40)).astype(np.float32))
    tensors = [base[:, :24], base[5:9, 8:32], base[::3, 16:], base[:1, :24].expand(6, 24),
               base[:7, :24].clone().requires_grad_(True)]
    arrays = [t.detach().numpy() for t in tensors]
    got = _maxsim_unpacked(packed, tensors)
    if got is None:
        pytest.skip("no AVX-512 family on this CPU")
    assert got.tobytes() == _maxsim_unpacked(packed, arrays).tobytes()
    assert not np.isnan(got).any()
    # Left to the caller (NaN): columns not contiguous, another dtype or depth, no rows, a lazily
    # negated view (its memory lacks the sign), an infinity.
    with_inf = base[:3, :24].clone()
    with_inf[1, 2] = float("inf")
    others = [base[:24, :24].t(), base[:4, :24].double(), base[:4, :23], base[:0, :24],
              torch._neg_view(base[:4, :24]), with_inf]
    assert np.isnan(_maxsim_unpacked(packed, others)).all()
