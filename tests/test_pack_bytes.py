"""Packed bytes are a format: every packer must write the same bytes for the same input.

Other machines, and verification at load time, re-derive and compare packed buffers bit for bit, so a
faster packer must be byte-identical to the one it replaces. Two checks:

- Golden digests: fixed cases (every source dtype x every packing dtype x awkward depths, rows 1..40,
  values from a self-contained generator: wide dynamic ranges that hit every format's subnormals and
  the per-row scaling, exact round-to-nearest-even ties, negative zeros, zero and sparse rows, random
  finite bit patterns) packed with maxsim_pack, and a few corpora with maxsim_pack_corpus; the SHA-256
  of each buffer (its first 16 hex digits) must equal pack_bytes_digests.txt, written by the packer of
  commit 8e007da (`python tests/test_pack_bytes.py --write tests/pack_bytes_digests.txt`), except six
  float64 -> int8/int4 cases: their rows with subnormal magnitudes were quantized wrongly by that packer;
  and the corpus lines, rewritten for corpus format 5 (each document's prescreen after its matrix).
- Property: a float32, float16 or bfloat16 source packs to the same bytes as its exact float64 copy
  (the packer's original path) when it is cast to another format, for any finite values (hypothesis).
"""
import hashlib
import os
import sys

import ml_dtypes
import numpy as np

import numkong as nk

DIGESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pack_bytes_digests.txt")
SOURCES = ["float64", "float32", "float16", "bfloat16", "int8", "bool"]
TARGETS = ["float64", "float32", "float16", "bfloat16", "e4m3", "e5m2", "e2m3", "e3m2", "int8", "int4", "uint1"]
DEPTHS = [1, 3, 17, 128, 129, 255, 256, 257, 1000]
REGIMES = ["normal", "wide", "bits", "ties", "zero", "sparse"]
# (exponent bits, mantissa bits) of the float sources; mantissa bits of the float targets.
_FLOAT_SOURCES = {"float64": (11, 52), "float32": (8, 23), "float16": (5, 10), "bfloat16": (8, 7)}
_TARGET_MANTISSA = {"float64": 52, "float32": 23, "float16": 10, "bfloat16": 7, "e4m3": 3, "e5m2": 2, "e2m3": 3,
                    "e3m2": 2}
_NUMPY = {"float64": np.float64, "float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
          "int8": np.int8, "bool": np.bool_}
_UINT = {64: np.uint64, 32: np.uint32, 16: np.uint16}
# Row exponents at the edges of the scaling rules (2^+-100, 2^+-400) and of the formats' ranges.
_EDGES = [0, 15, 16, -14, -15, -24, -99, -100, -101, 99, 100, 101, -126, -127, 127, -399, -400, -401, 399, 400, 1023,
          -1022]


def _random_u64(seed, count):
    """splitmix64: the same stream on every NumPy version and platform."""
    z = np.arange(count, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    z += np.full(count, seed, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03) + np.uint64(0x632BE59BD9B4E019)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _float_row(source, target, regime, seed, depth):
    """One row of a float source, built from its bit fields (every value finite)."""
    exponent_bits, mantissa_bits = _FLOAT_SOURCES[source]
    width, bias, top = 1 + exponent_bits + mantissa_bits, (1 << (exponent_bits - 1)) - 1, (1 << exponent_bits) - 2
    r = _random_u64(seed, 4 * depth + 4)
    sign = (r[:depth] >> np.uint64(63)).astype(np.int64)
    mantissa = (r[depth:2 * depth] & np.uint64((1 << mantissa_bits) - 1)).astype(np.uint64)
    pick = (r[2 * depth:3 * depth] % np.uint64(1 << 20)).astype(np.int64)
    extra = (r[3 * depth:4 * depth] % np.uint64(1 << 20)).astype(np.int64)
    head = [int(v % np.uint64(1 << 30)) for v in r[4 * depth:]]
    edge = _EDGES[head[0] % len(_EDGES)] if head[1] % 2 else head[2] % (top + 1) - bias
    row_exponent = min(max(edge + bias, 1), top)  # biased exponent of the row's largest values
    if regime == "normal":
        exponent = bias + pick % 7 - 3
    elif regime in ("wide", "sparse"):
        exponent = row_exponent - pick % 61
    elif regime == "bits":
        exponent = pick % (top + 1)
    elif regime == "ties":  # exactly halfway between two values of the target (after any power-of-two scaling)
        exponent = bias + pick % 7 - 3 if head[3] % 2 else row_exponent - pick % 3
        drop = mantissa_bits - _TARGET_MANTISSA.get(target, extra[0] % mantissa_bits)
        if drop > 0:
            mantissa = (mantissa >> np.uint64(drop) << np.uint64(drop)) | np.uint64(1 << (drop - 1))
    else:  # zero
        exponent = np.zeros(depth, dtype=np.int64)
        mantissa[:] = 0
    exponent = np.clip(exponent, 0, top).astype(np.uint64)
    if regime == "sparse":
        keep = extra % 13 == 0
        exponent, mantissa = np.where(keep, exponent, 0), np.where(keep, mantissa, 0)
    bits = (sign.astype(np.uint64) << np.uint64(width - 1)) | (exponent << np.uint64(mantissa_bits)) | mantissa
    return bits.astype(_UINT[width]).view(_NUMPY[source])


def case_array(source, target, depth, rows, seed):
    """A [rows, depth] array of `source`, each row of a regime that cycles with the seed."""
    if source == "bool":
        return (_random_u64(seed, rows * depth) & np.uint64(1)).astype(np.bool_).reshape(rows, depth)
    if source == "int8":
        values = (_random_u64(seed, rows * depth) % np.uint64(255)).astype(np.int64) - 127
        values[::5] = 0
        return values.astype(np.int8).reshape(rows, depth)
    return np.stack([_float_row(source, target, REGIMES[(seed + r) % len(REGIMES)], seed * 1000 + r, depth)
                     for r in range(rows)])


def _cases():
    """(key, source, target, depth, rows, seed) of every fixed case."""
    index = 0
    for source in SOURCES:
        for target in TARGETS:
            for depth in DEPTHS:
                for variant in range(2):
                    rows = 1 + (index * 7 + variant * 19) % 40
                    yield f"{source} {target} {depth} {rows} {index}", source, target, depth, rows, index
                    index += 1


def _digest(packed):
    return hashlib.sha256(bytes(memoryview(packed))).hexdigest()[:16]


def _corpus_cases():
    """(key, documents, target): float32 and float64 documents of different lengths, packed on 2 threads."""
    for source in ("float32", "float64"):
        for target in TARGETS:
            docs = [case_array(source, target, 129, 1 + (7 * i) % 23, 5000 + i) for i in range(9)]
            yield f"corpus {source} {target}", docs, target


def digest_lines():
    """One 'key digest' line per case, as the packer installed now writes them."""
    lines = []
    for key, source, target, depth, rows, seed in _cases():
        lines.append(f"{key} {_digest(nk.maxsim_pack(case_array(source, target, depth, rows, seed), target))}")
    for key, docs, target in _corpus_cases():
        lines.append(f"{key} {_digest(nk.maxsim_pack_corpus(docs, dtype=target, threads=2))}")
    return lines


def test_golden_digests():
    with open(DIGESTS) as f:
        expected = [line.rstrip("\n") for line in f if line.strip() and not line.startswith("#")]
    got = digest_lines()
    assert len(got) == len(expected)
    wrong = [f"{e}  (now {g.rsplit(' ', 1)[1]})" for e, g in zip(expected, got) if e != g]
    assert not wrong, f"{len(wrong)} of {len(got)} cases pack to other bytes:\n" + "\n".join(wrong[:20])


if __name__ == "__main__" and sys.argv[1:2] == ["--write"]:
    with open(sys.argv[2], "w") as f:
        f.write(f"# key: source target depth rows seed; sha256[:16] of the packed bytes (numkong {nk.__version__})\n")
        f.write("\n".join(digest_lines()) + "\n")
else:
    import pytest
    from hypothesis import HealthCheck, assume, given, settings
    from hypothesis import strategies as st

    HEADER_BYTES = 128  # holds the stored capability mask; every byte after it is data

    @pytest.mark.parametrize("family", [name for name in ("haswell", "skylake", "icelake")
                                        if name in str(nk.get_capabilities())])
    def test_every_family_packs_the_same_bytes(family):
        """The packer's row routines exist as a portable and an AVX-512 compilation (picked by the pack's
        capability mask and the CPU): a pack restricted to serial and one restricted to `family` store
        the same bytes after the header, on every fixed case."""
        mask = nk.Capability[family.upper()]
        differ = []
        for key, source, target, depth, rows, seed in _cases():
            arr = case_array(source, target, depth, rows, seed)
            serial = bytes(memoryview(nk.maxsim_pack(arr, target, capabilities=nk.Capability.SERIAL)))
            wide = bytes(memoryview(nk.maxsim_pack(arr, target, capabilities=mask)))
            if serial[HEADER_BYTES:] != wide[HEADER_BYTES:]:
                differ.append(key)
        assert not differ, f"{len(differ)} cases differ, e.g. {differ[:5]}"

    def _without_masks(corpus):
        """A corpus's bytes with the stored capability masks (its header's, each document's) and the
        checksum over them zeroed: what is left must not depend on the routines that packed it."""
        data = bytearray(memoryview(corpus))
        data[40:48] = data[64:72] = bytes(8)  # nk_corpus_header_t: capabilities, checksum
        documents, table = (int.from_bytes(data[at:at + 8], "little") for at in (24, 56))
        for i in range(documents):
            offset = int.from_bytes(data[table + 16 * i:table + 16 * i + 8], "little")
            data[offset + 32:offset + 40] = bytes(8)  # the document's nk_maxsim_header_t capabilities
        return bytes(data)

    @pytest.mark.parametrize("family", [name for name in ("haswell", "skylake", "icelake")
                                        if name in str(nk.get_capabilities())])
    def test_every_family_packs_the_same_corpus_bytes(family):
        """Corpora too (each float-format document's prescreen comes from the same routines)."""
        mask = nk.Capability[family.upper()]
        differ = [key for key, docs, target in _corpus_cases()
                  if _without_masks(nk.maxsim_pack_corpus(docs, dtype=target, capabilities=nk.Capability.SERIAL))
                  != _without_masks(nk.maxsim_pack_corpus(docs, dtype=target, capabilities=mask))]
        assert not differ, f"{len(differ)} corpora differ, e.g. {differ[:5]}"

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(source=st.sampled_from(["float32", "float16", "bfloat16"]), target=st.sampled_from(TARGETS),
           depth=st.sampled_from(DEPTHS), rows=st.integers(1, 40), seed=st.integers(0, 2 ** 40),
           raw=st.booleans(), data=st.data())
    def test_narrow_source_packs_as_its_float64_copy(source, target, depth, rows, seed, raw, data):
        """The original packer read every non-native source through an exact float64 copy; reading the
        narrow source directly must not change a byte. (A source already in the packing format is
        stored as it is, without the rescaling a cast gets: not comparable with a float64 copy.)"""
        assume(source != target)
        arr = case_array(source, target, depth, rows, seed)
        if raw:  # hypothesis' own values over a regime row: shrinkable, and every finite pattern
            width = 32 if source == "float32" else 16
            bits = data.draw(st.lists(st.integers(0, 2 ** width - 1), min_size=depth, max_size=depth))
            row = np.array(bits, dtype=_UINT[width]).view(_NUMPY[source])
            with np.errstate(invalid="ignore"):
                row[~np.isfinite(row.astype(np.float64))] = 0
            arr[data.draw(st.integers(0, rows - 1))] = row
        assert np.all(np.isfinite(arr.astype(np.float64)))
        direct = bytes(memoryview(nk.maxsim_pack(arr, target)))
        widened = bytes(memoryview(nk.maxsim_pack(arr.astype(np.float64), target)))
        assert direct == widened

    @pytest.mark.parametrize("source", ["float32", "float16", "bfloat16"])
    @pytest.mark.parametrize("target", TARGETS)
    def test_strided_and_offset_sources(source, target):
        """Rows with a stride (a column slice of a wider array) and a misaligned start pack as a copy."""
        wide = case_array(source, target, 300, 17, 77)
        view = wide[:, 10:139]
        copy = np.ascontiguousarray(view)
        expected = bytes(memoryview(nk.maxsim_pack(copy if source == target else copy.astype(np.float64), target)))
        assert bytes(memoryview(nk.maxsim_pack(view, target))) == expected
        if source == target:
            return  # a misaligned source in the packing format is cast through float64, rescaling it
        raw = np.zeros(view.size * view.itemsize + 1, dtype=np.uint8)
        shifted = raw[1:].view(view.dtype).reshape(view.shape)  # not aligned to its itemsize
        shifted[...] = view
        assert bytes(memoryview(nk.maxsim_pack(shifted, target))) == expected
