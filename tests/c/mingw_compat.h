/* Forced into check_kernels.c by tests/c/run_mingw.sh. The driver allocates packed buffers with C11
 * aligned_alloc, which the Microsoft C runtime lacks, and its free() cannot release _aligned_malloc
 * memory; so under mingw every allocation of the driver goes through _aligned_malloc / _aligned_free.
 * The driver calls only malloc, aligned_alloc and free. */
#include <malloc.h>
#include <stdlib.h>
#define aligned_alloc(alignment, size) _aligned_malloc((size), (alignment))
#define malloc(size) _aligned_malloc((size), 16)
#define free(pointer) _aligned_free(pointer)
