/* driver.h's rescoring primitives for the AVX-512 families that use all of avx512_dot.h (exact dot
 * products, float32 checks with a proven error bound, query rows decoded once): define them, then
 * include driver.h. */
#define nk_family_dot_batch nk_x512_dot_batch
#define NK_FAMILY_F32_CHECKS 1
#define nk_family_cosine_f32(dtype, a, b, depth, inv_q, inv_d, slack) \
    nk_x512_cosine_f32(dtype, a, 0, b, depth, inv_q, inv_d, slack)
#define NK_FAMILY_DECODE 1
#define nk_family_decode_row nk_x512_decode_row
#define nk_family_dot_decoded nk_x512_dot_decoded
