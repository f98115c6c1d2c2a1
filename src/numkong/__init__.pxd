# `from numkong cimport MaxSimPackedMatrix, maxsim_packed_nogil` for other Cython extensions.
# Compile them with include_dirs=[numkong.get_include()] (the C header numkong/maxsim.h).
from numkong._maxsim cimport (
    MaxSimPackedMatrix,
    maxsim_packed_nogil,
    nk_maxsim_info,
    nk_maxsim_info_t,
    nk_maxsim_score,
    nk_status_t,
)
