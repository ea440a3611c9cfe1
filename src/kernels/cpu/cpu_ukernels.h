/* The CPU backend's microkernels that come in more than one variant (its float kernels, and the
 * conversions between float and the NPU's integer activations): one function type per family, and
 * the choice of the best variant for this CPU. The variants (npu_<family>__scalar, __avx2; none
 * for NEON yet: on AArch64 the scalar ones run, which give the same bits) are listed once in
 * src/kernels/cpu/ukernels.inc, which feeds the declarations below, the dispatch in
 * cpu_ukernels.c and tests/test_cpu_kernels.c. Every variant gives the bits of its family's scalar
 * one; the float kernels' scalar ones give the reference forward's (kernels.h, f32_util.h) and are
 * portable C (GCC/Clang vector extensions). Kernels never allocate and keep no state. Shapes and
 * the attention lengths npu_attn_len(t) and tiles as in kernels.h. */
#ifndef NPU_KERNELS_CPU_CPU_UKERNELS_H
#define NPU_KERNELS_CPU_CPU_UKERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "base/isa.h"    /* NPU_ISA_*, npu_isa_detect */
#include "model/model.h" /* struct npu_config */

/* out[t, n] = sum_i x[t, i] * w[n, i] (+ bias[n]): x [rows, k], w [n, k], out [rows, n]; bias may
 * be NULL. Each weight row is read once per tile of rows. */
typedef void npu_f32_matmul_fn(float *restrict out, const float *restrict x,
                               const float *restrict w, const float *restrict bias, int32_t rows,
                               int32_t k, int32_t n);

/* out = x with each head of row t rotated to position pos0 + t (table rows of
 * npu_f32_rope_table must cover pos0 + rows - 1); x [rows, heads * head_dim]. Pairs per
 * cfg->rope_type ("norm": (2i, 2i+1), "neox": (i, i + rope_dim/2)); dimensions past rope_dim are
 * copied. */
typedef void npu_f32_rope_fn(float *restrict out, const float *restrict x,
                             const float *restrict cos_tab, const float *restrict sin_tab,
                             const struct npu_config *cfg, int32_t rows, int32_t heads,
                             int32_t pos0);

/* Scores s[h, t, j] = q[t, h] . k[j, h / group] * scale for j < npu_attn_len(t), -inf for the rest
 * of the bucket's 'ctx' positions; each dot adds as npu_ref_dot does. q [rows, heads * hd]; k
 * cache rows of kv_heads * hd floats. QK, SOFTMAX (kernels.h) and PV serve attention split around
 * the integer NPU; all in float, it is the fused attention. */
typedef void npu_f32_qk_fn(float *restrict s, const float *restrict q, const float *restrict k,
                           int32_t heads, int32_t kv_heads, int32_t hd, int32_t rows, int32_t ctx,
                           int32_t pos0, int32_t n_valid, float scale);

/* out[t, h] = sum_{j < npu_attn_len(t)} p[h, t, j] * v[j, h / group]; out [rows, heads * hd]. */
typedef void npu_f32_pv_fn(float *restrict out, const float *restrict p, const float *restrict v,
                           int32_t heads, int32_t kv_heads, int32_t hd, int32_t rows, int32_t ctx,
                           int32_t pos0, int32_t n_valid);

/* Fused attention: out[t, h] = sum_j softmax_j(q[t, h] . k[j, h / group] * scale) v[j, h / group]
 * over j < npu_attn_len(t), exactly as npu_ref_attention computes it (tiles of NPU_REF_ATTN_TILE
 * keys folded in key order), so each element has the reference's bits. q, out [rows, heads * hd];
 * k, v cache rows of kv_heads * hd floats. Scratch is a few hundred bytes of stack (one tile's
 * scores, running maxima and sums): no scores or probabilities are stored, so memory does not
 * grow with the context; each output row holds its running weighted sum. An element's bits do
 * not depend on the rows given, so threads may take disjoint ranges of rows. */
typedef void npu_f32_attention_fn(float *restrict out, const float *restrict q,
                                  const float *restrict k, const float *restrict v, int32_t heads,
                                  int32_t kv_heads, int32_t hd, int32_t rows, int32_t pos0,
                                  int32_t n_valid, float scale);

/* Decode attention split by keys: the tiles of NPU_REF_ATTN_TILE keys that npu_ref_attention
 * defines attention by, each on its own, then folded in key order (npu_f32_attention_fold), so
 * threads may take disjoint ranges of them and the result has the reference's bits whatever the
 * ranges. For one query row q (heads * hd) over keys 0 .. len-1 of the caches (rows of
 * kv_heads * hd floats), the units u0 .. u1-1, unit u being tile u / heads of head u % heads:
 * part[u * (hd + 2) ..] receives the tile's maximum score, its sum of exponentials and its
 * weighted sum of values (hd). */
typedef void npu_f32_attention_tiles_fn(float *restrict part, const float *restrict q,
                                        const float *restrict k, const float *restrict v,
                                        int32_t heads, int32_t kv_heads, int32_t hd, int32_t len,
                                        int32_t u0, int32_t u1, float scale);

/* The transfers between the backends: q = sat(round(x / scale) + zero_point), rounding half away
 * from zero (NaN -> zero_point, +-inf saturate), into int8 or int16, and back:
 * x = scale * (q - zero_point). scale > 0; zero_point within the integer type's range; any n,
 * 0 included. Integer results and float products each defined by one expression, so every
 * variant gives the scalar one's bytes. */
typedef void npu_quantize_s8_fn(const float *restrict x, size_t n, float scale, int32_t zero_point,
                                int8_t *restrict q_out);
typedef void npu_quantize_s16_fn(const float *restrict x, size_t n, float scale, int32_t zero_point,
                                 int16_t *restrict q_out);
typedef void npu_dequantize_s8_fn(const int8_t *restrict q, size_t n, float scale,
                                  int32_t zero_point, float *restrict x_out);
typedef void npu_dequantize_s16_fn(const int16_t *restrict q, size_t n, float scale,
                                   int32_t zero_point, float *restrict x_out);

/* Declarations of every variant: npu_f32_matmul__scalar, npu_f32_matmul__avx2, ... */
#define CPU_UKERNEL(family, variant, isa) npu_##family##_fn npu_##family##__##variant;
#include "kernels/cpu/cpu_ukernels.inc"
#undef CPU_UKERNEL

/* The chosen variant of each family. */
struct npu_cpu_ukernels {
  npu_f32_matmul_fn *f32_matmul;
  npu_f32_rope_fn *f32_rope;
  npu_f32_qk_fn *f32_qk;
  npu_f32_pv_fn *f32_pv;
  npu_f32_attention_fn *f32_attention;
  npu_f32_attention_tiles_fn *f32_attention_tiles;
  npu_quantize_s8_fn *quantize_s8;
  npu_quantize_s16_fn *quantize_s16;
  npu_dequantize_s8_fn *dequantize_s8;
  npu_dequantize_s16_fn *dequantize_s16;
};

/* Fill 'uk_out' with, for each family, the last variant in cpu_ukernels.inc whose extensions are
 * all in 'isa' (pass npu_isa_detect(), or 0 to force the scalar kernels). */
void npu_cpu_ukernels_select(uint32_t isa, struct npu_cpu_ukernels *uk_out);

/* The variant name ("scalar", "avx2") of the kernel 'uk' holds for 'family' ("f32_matmul", ...),
 * for reports and tests; "?" if the family is unknown or no listed variant. */
const char *npu_cpu_ukernels_variant(const struct npu_cpu_ukernels *uk, const char *family);

#endif /* NPU_KERNELS_CPU_CPU_UKERNELS_H */
