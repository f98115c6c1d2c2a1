/* pack_rows.h compiled with a SIMD family's flags (meson: -DNK_PACK_ROWS_NAME=nk_pack_rows_<family>);
 * pack.c picks this table when the CPU has the family. */
#include "pack_rows.h"
