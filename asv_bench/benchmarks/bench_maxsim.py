"""MaxSim packing and scoring across dtypes, shapes and kernel families.

Shapes are queries x documents x depth. The `family` parameter runs over the kernel families this
CPU supports, so the parameter grid is the same for every commit on one machine; a family that a
commit did not compile (or that NUMKONG_DISABLE removed) is skipped.
"""
import sys

import numpy as np

import numkong as nk

DTYPES = ["float32", "bfloat16", "float16", "e4m3", "int8", "int4", "uint1"]
SHAPES = ["32x180x128", "32x1024x128", "1024x1024x128", "32x512x768"]
FAMILIES = [c.name.lower() for c in nk.Capability if nk.get_capabilities("cpu") & c]


def family_names(mask):
    return ", ".join(c.name.lower() for c in nk.Capability if mask & c)


def operands(shape):
    """Deterministic float32 (queries, documents) for a 'QxDxdepth' shape string."""
    count_q, count_d, depth = map(int, shape.split("x"))
    rng = np.random.default_rng([count_q, count_d, depth])
    return (rng.standard_normal((count_q, depth), dtype=np.float32),
            rng.standard_normal((count_d, depth), dtype=np.float32))


def capability(family):
    """The Capability for `family`, or NotImplementedError (asv: skipped) if this build lacks it."""
    flag = nk.Capability[family.upper()]
    if not nk.get_capabilities("available") & flag:
        raise NotImplementedError(f"{family} is not available in this build")
    return flag


class Build:
    """Which kernel families this run measures: a 1/0 table per family, and a line on stderr once."""

    params = FAMILIES
    param_names = ["family"]

    def setup_cache(self):
        available = nk.get_capabilities("available")
        print(f"numkong {nk.__version__}: compiled {family_names(nk.get_capabilities('compiled'))}; "
              f"active {family_names(available)}", file=sys.stderr)
        return int(available)

    def track_active(self, available, family):
        return int(bool(available & nk.Capability[family.upper()]))

    track_active.unit = "active"


class Pack:
    """maxsim_pack() of the document matrix from float32 (cast, norms, screening copy)."""

    params = (DTYPES, SHAPES, FAMILIES)
    param_names = ["dtype", "shape", "family"]
    timeout = 300

    def setup(self, dtype, shape, family):
        self.flag = capability(family)
        _, self.documents = operands(shape)

    def time_pack(self, dtype, shape, family):
        nk.maxsim_pack(self.documents, dtype=dtype, capabilities=self.flag)


class Score:
    """maxsim_packed() on pre-packed operands: the per-(query, document) cost of a reranker."""

    params = (DTYPES, SHAPES, FAMILIES)
    param_names = ["dtype", "shape", "family"]
    timeout = 300

    def setup(self, dtype, shape, family):
        self.flag = capability(family)
        self.queries, self.documents = (nk.maxsim_pack(m, dtype=dtype, capabilities=self.flag)
                                        for m in operands(shape))

    def time_score(self, dtype, shape, family):
        nk.maxsim_packed(self.queries, self.documents, capabilities=self.flag)


class Corpus:
    """maxsim_packed_corpus(): one 32 x 128 float32 query against 1,000 documents, on 1 and 2 threads."""

    params = (["180", "50..800"], [1, 2])
    param_names = ["lengths", "threads"]
    timeout = 300

    def setup(self, lengths, threads):
        if not hasattr(nk, "maxsim_packed_corpus"):
            raise NotImplementedError("this commit has no packed corpora")
        rng = np.random.default_rng(7)
        counts = np.full(1000, 180) if lengths == "180" else rng.integers(50, 801, 1000)
        self.query = nk.maxsim_pack(rng.standard_normal((32, 128), dtype=np.float32))
        self.corpus = nk.maxsim_pack_corpus([rng.standard_normal((int(n), 128), dtype=np.float32) for n in counts])

    def time_score_corpus(self, lengths, threads):
        nk.maxsim_packed_corpus(self.query, self.corpus, threads=threads)


class Rerank:
    """numkong.pylate.colbert_scores(): one 32 x 128 float32 query against 1,000 raw float32 documents of
    180 rows (scored unpacked on AVX-512 CPUs, packed first elsewhere) and against the same documents
    packed ahead, on 1 and 2 threads."""

    params = (["raw", "packed ahead"], [1, 2])
    param_names = ["documents", "threads"]
    timeout = 300

    def setup(self, documents, threads):
        try:
            from numkong import pylate
        except ImportError:
            raise NotImplementedError("this commit has no numkong.pylate")
        rng = np.random.default_rng(11)
        self.pylate = pylate
        self.queries = [rng.standard_normal((32, 128), dtype=np.float32)]
        raw = [rng.standard_normal((180, 128), dtype=np.float32) for _ in range(1000)]
        self.documents = raw if documents == "raw" else pylate.pack_documents(raw)

    def time_colbert_scores(self, documents, threads):
        self.pylate.colbert_scores(self.queries, self.documents, threads=threads)
