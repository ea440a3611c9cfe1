/* npu_qs8_gather__neon, npu_qs8_gather_qs16__neon: 16 columns per step with the row's constants
 * in every lane; the tail of a row uses the scalar definition (bit-exact). */
#include "kernels/npu/npu_ukernels.h"

#if defined(__aarch64__)

#include <assert.h>

#include "kernels/npu/fixedpoint.h"
#include "kernels/npu/neon_util.h"

NPU_INLINE_NEON void gather(size_t n_ids, const int32_t *restrict ids, size_t n_rows, size_t cols,
                            const int8_t *restrict table, void *restrict y, size_t y_stride,
                            const struct npu_qs8_gather_params *restrict p, int out16) {
  const int32x4_t yzp = vdupq_n_s32(p->y_zero_point);
  for (size_t t = 0; t < n_ids; t++) {
    assert(ids[t] >= 0 && (size_t)ids[t] < n_rows);
    const size_t r = (size_t)ids[t];
    const int8_t *row = table + r * cols;
    int8_t *y8 = (int8_t *)y + t * y_stride;
    int16_t *y16 = (int16_t *)y + t * y_stride;
    const struct npu_neon_rq rq = npu_neon_rq_make1(p->mult[r], p->shift[r]);
    size_t c = 0;
    for (; c + 16 <= cols; c += 16) {
      const int8x16_t v = vld1q_s8(row + c);
      const int16x8_t lo = vmovl_s8(vget_low_s8(v)), hi = vmovl_high_s8(v);
      const int32x4_t q0 =
          npu_neon_add_zp(npu_neon_requantize(vmovl_s16(vget_low_s16(lo)), &rq), yzp);
      const int32x4_t q1 = npu_neon_add_zp(npu_neon_requantize(vmovl_high_s16(lo), &rq), yzp);
      const int32x4_t q2 =
          npu_neon_add_zp(npu_neon_requantize(vmovl_s16(vget_low_s16(hi)), &rq), yzp);
      const int32x4_t q3 = npu_neon_add_zp(npu_neon_requantize(vmovl_high_s16(hi), &rq), yzp);
      if (out16) {
        vst1q_s16(y16 + c, npu_neon_narrow_s16(q0, q1));
        vst1q_s16(y16 + c + 8, npu_neon_narrow_s16(q2, q3));
      } else {
        vst1q_s8(y8 + c, npu_neon_narrow_s8(q0, q1, q2, q3));
      }
    }
    for (; c < cols; c++) {
      if (out16) y16[c] = npu_requantize_s16(row[c], p->mult[r], p->shift[r], p->y_zero_point);
      else y8[c] = npu_requantize_s8(row[c], p->mult[r], p->shift[r], p->y_zero_point);
    }
  }
  (void)n_rows;
}

void npu_qs8_gather__neon(size_t n_ids, const int32_t *restrict ids, size_t n_rows, size_t cols,
                          const int8_t *restrict table, int8_t *restrict y, size_t y_stride,
                          const struct npu_qs8_gather_params *restrict params) {
  gather(n_ids, ids, n_rows, cols, table, y, y_stride, params, 0);
}

void npu_qs8_gather_qs16__neon(size_t n_ids, const int32_t *restrict ids, size_t n_rows,
                               size_t cols, const int8_t *restrict table, int16_t *restrict y,
                               size_t y_stride,
                               const struct npu_qs8_gather_params *restrict params) {
  gather(n_ids, ids, n_rows, cols, table, y, y_stride, params, 1);
}

#endif /* __aarch64__ */
