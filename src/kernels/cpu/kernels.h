/* FP32 kernels of the CPU backend: one per graph op; those with several variants (matmul, RoPE,
 * QK, PV, the fused attention) are cpu_ukernels.h's, chosen once per session by CPU features. Each
 * computes every output element in the same order of operations as the reference forward
 * (src/ref/forward.c), so a graph run in FP32 reproduces the reference bit for bit, and an element
 * never depends on how many rows the step has or how the kernel tiles them (chunked prefill ==
 * token-by-token decode exactly). Kernels never allocate; operands never alias (restrict). Shapes
 * follow the graph IR: activations [rows, cols] row-major, attention scores [heads, rows, ctx] (QK,
 * SOFTMAX, PV; the fused attention keeps none). */
#ifndef NPU_KERNELS_CPU_KERNELS_H
#define NPU_KERNELS_CPU_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/cpu_ukernels.h" /* the kernels with several variants: matmul, RoPE, attention */
#include "model/model.h"
#include "ref/forward.h" /* NPU_REF_ATTN_TILE: the tiles that define attention */

/* Attention of row 't' of a step starting at cache position 'pos0' with 'n_valid' real rows sees
 * cache positions 0 .. len-1: causal (j <= pos0 + t), and never past the step's real tokens, so
 * padded rows read only what the step wrote and never beyond it. */
static inline int32_t npu_attn_len(int32_t pos0, int32_t n_valid, int32_t t) {
  int32_t last = t < n_valid ? t : n_valid - 1;
  return pos0 + last + 1;
}

/* The tiles of NPU_REF_ATTN_TILE keys that attention over keys 0 .. len-1 is defined by. */
static inline int32_t npu_attn_tiles(int32_t len) {
  return (len + NPU_REF_ATTN_TILE - 1) / NPU_REF_ATTN_TILE;
}

/* out[t] = table[ids[t]] for t < rows; each id in 0 .. table rows-1. */
void npu_f32_gather(float *restrict out, const float *restrict table, const int32_t *restrict ids,
                    int32_t rows, int32_t cols);

/* out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, per row. */
void npu_f32_rmsnorm(float *restrict out, const float *restrict x, const float *restrict w,
                     int32_t rows, int32_t cols, float eps);

/* The rotation table of RoPE for positions 0 .. n_pos-1: cos_out/sin_out (n_pos, rope_dim / 2),
 * computed as the reference does; 'freq_factors' (rope_dim / 2) may be NULL. */
void npu_f32_rope_table(float *restrict cos_out, float *restrict sin_out, int32_t n_pos,
                        const struct npu_config *cfg, const float *restrict freq_factors);

/* cache rows pos0 .. pos0+n_valid-1 = x rows 0 .. n_valid-1 (row width 'cols'). */
void npu_f32_kv_write(float *restrict cache, const float *restrict x, int32_t pos0, int32_t n_valid,
                      int32_t cols);

/* Read one byte of every 64-byte line of [p, p + bytes), front to back, and return their sum (so
 * that the reads happen): brings a region into the caches as one sequential stream, which the
 * hardware prefetcher runs ahead of, where a kernel that walks it in small strided pieces would
 * wait on each line (decode attention over a cold KV cache). */
uint32_t npu_touch_lines(const void *p, size_t bytes);

/* out[t, h] = sum_{j < npu_attn_len(t)} p[h, t, j] * v[j, h / group]; out [rows, heads * hd]. */
void npu_f32_pv(float *restrict out, const float *restrict p, const float *restrict v,
                int32_t heads, int32_t kv_heads, int32_t hd, int32_t rows, int32_t ctx,
                int32_t pos0, int32_t n_valid);

/* Softmax of each score row over its first npu_attn_len(t) entries; the masked rest become 0. */
void npu_f32_softmax(float *restrict p, const float *restrict s, int32_t heads, int32_t rows,
                     int32_t ctx, int32_t pos0, int32_t n_valid);

/* Fold the units of tiles 0 .. n_tiles-1 of 'part' (npu_f32_attention_tiles) in key order into
 * out (heads * hd), normalized: the query row's attention, bit for bit the reference's. */
void npu_f32_attention_fold(float *restrict out, const float *restrict part, int32_t heads,
                            int32_t hd, int32_t n_tiles);

/* Element-wise over n floats. */
void npu_f32_add(float *restrict out, const float *restrict a, const float *restrict b, size_t n);
void npu_f32_mul(float *restrict out, const float *restrict a, const float *restrict b, size_t n);
void npu_f32_silu(float *restrict out, const float *restrict x, size_t n);

#endif /* NPU_KERNELS_CPU_KERNELS_H */
