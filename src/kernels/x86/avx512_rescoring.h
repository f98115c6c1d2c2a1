/* driver.h's rescoring primitives for the AVX-512 families that use all of avx512_dot.h (exact dot
 * products, float32 checks with a proven error bound, query rows decoded once): define them, then
 * include driver.h. */
#define nk_family_dot_batch nk_x512_dot_batch
#define NK_FAMILY_F32_CHECKS 1
#define nk_family_cosine_f32 nk_x512_cosine_f32
#define NK_FAMILY_DECODE 1
#define nk_family_decode_row nk_x512_decode_row
#define nk_family_dot_decoded nk_x512_dot_decoded
