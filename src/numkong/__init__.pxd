# `from numkong cimport MaxSimPackedMatrix, maxsim_packed_nogil` for other Cython extensions.
# Compile them with include_dirs=[numkong.get_include()] (the C header numkong/maxsim.h).
from numkong._maxsim cimport (
    MaxSimPackedCorpus,
    MaxSimPackedMatrix,
    maxsim_packed_corpus_nogil,
    maxsim_packed_nogil,
    nk_maxsim_info_t,
    nk_maxsim_matrix_t,
    nk_maxsim_score_matrices,
    nk_status_t,
)
