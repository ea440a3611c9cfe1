/* npu_qs8_vmul__neon, npu_qs16_vmul__neon: 16 elements per step; the zero points come off in
 * int16 (vsubl_s8: |x - zero_point| <= 255) and vmull_s16 forms the exact int32 products; the
 * tail goes through the scalar kernel (same definition, bit-exact). */
#include "kernels/npu/npu_ukernels.h"

#if defined(__aarch64__)

#include <assert.h>

#include "kernels/npu/neon_util.h"

/* 8 int16 factors of each side -> 8 requantized outputs with the zero point, in out[0..1]. */
NPU_INLINE_NEON void mul8(int16x8_t a, int16x8_t b, const struct npu_neon_rq *rq, int32x4_t yzp,
                          int32x4_t out[2]) {
  out[0] =
      npu_neon_add_zp(npu_neon_requantize(vmull_s16(vget_low_s16(a), vget_low_s16(b)), rq), yzp);
  out[1] = npu_neon_add_zp(npu_neon_requantize(vmull_high_s16(a, b), rq), yzp);
}

void npu_qs8_vmul__neon(size_t n, const int8_t *a, const int8_t *b, int8_t *y,
                        const struct npu_qmul_params *restrict p) {
  assert(p->a_zero_point >= INT8_MIN && p->a_zero_point <= INT8_MAX);
  assert(p->b_zero_point >= INT8_MIN && p->b_zero_point <= INT8_MAX);
  const int8x16_t za = vdupq_n_s8((int8_t)p->a_zero_point);
  const int8x16_t zb = vdupq_n_s8((int8_t)p->b_zero_point);
  const int32x4_t yzp = vdupq_n_s32(p->y_zero_point);
  const struct npu_neon_rq rq = npu_neon_rq_make1(p->y_mult, p->y_shift);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const int8x16_t va = vld1q_s8(a + i), vb = vld1q_s8(b + i);
    int32x4_t lo[2], hi[2];
    mul8(vsubl_s8(vget_low_s8(va), vget_low_s8(za)), vsubl_s8(vget_low_s8(vb), vget_low_s8(zb)),
         &rq, yzp, lo);
    mul8(vsubl_high_s8(va, za), vsubl_high_s8(vb, zb), &rq, yzp, hi);
    vst1q_s8(y + i, npu_neon_narrow_s8(lo[0], lo[1], hi[0], hi[1]));
  }
  if (i < n) npu_qs8_vmul__scalar(n - i, a + i, b + i, y + i, p);
}

void npu_qs16_vmul__neon(size_t n, const int16_t *a, const int16_t *b, int16_t *y,
                         const struct npu_qmul_params *restrict p) {
  assert(p->a_zero_point == 0 && p->b_zero_point == 0);
  const int32x4_t yzp = vdupq_n_s32(p->y_zero_point);
  const struct npu_neon_rq rq = npu_neon_rq_make1(p->y_mult, p->y_shift);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    int32x4_t lo[2], hi[2];
    mul8(vld1q_s16(a + i), vld1q_s16(b + i), &rq, yzp, lo);
    mul8(vld1q_s16(a + i + 8), vld1q_s16(b + i + 8), &rq, yzp, hi);
    vst1q_s16(y + i, npu_neon_narrow_s16(lo[0], lo[1]));
    vst1q_s16(y + i + 8, npu_neon_narrow_s16(hi[0], hi[1]));
  }
  if (i < n) npu_qs16_vmul__scalar(n - i, a + i, b + i, y + i, p);
}

#endif /* __aarch64__ */
