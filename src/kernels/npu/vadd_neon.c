/* npu_qs8_vadd__neon, npu_qs16_vadd__neon: 16 elements per step, widened to int32 lanes, each
 * side requantized to the common scale, summed and requantized to the output; the tail goes
 * through the scalar kernel (the same definition, so bit-exact). */
#include "kernels/npu/npu_ukernels.h"

#if defined(__aarch64__)

#include "kernels/npu/neon_util.h"

struct vadd_consts {
  int32x4_t za, zb, yzp, left; /* zero points; left_shift in every lane */
  struct npu_neon_rq rqa, rqb, rqy;
};

NPU_INLINE_NEON struct vadd_consts vadd_consts_make(const struct npu_qadd_params *p) {
  return (struct vadd_consts){.za = vdupq_n_s32(p->a_zero_point),
                              .zb = vdupq_n_s32(p->b_zero_point),
                              .yzp = vdupq_n_s32(p->y_zero_point),
                              .left = vdupq_n_s32(p->left_shift),
                              .rqa = npu_neon_rq_make1(p->a_mult, p->a_shift),
                              .rqb = npu_neon_rq_make1(p->b_mult, p->b_shift),
                              .rqy = npu_neon_rq_make1(p->y_mult, p->y_shift)};
}

/* 4 widened inputs of each side -> 4 outputs with the zero point, before saturation. The left
 * shift of (x - zero_point) never overflows in the valid ranges (npu_ukernels.h). */
NPU_INLINE_NEON int32x4_t add4(int32x4_t a, int32x4_t b, const struct vadd_consts *c) {
  const int32x4_t ta = npu_neon_requantize(vshlq_s32(vsubq_s32(a, c->za), c->left), &c->rqa);
  const int32x4_t tb = npu_neon_requantize(vshlq_s32(vsubq_s32(b, c->zb), c->left), &c->rqb);
  return npu_neon_add_zp(npu_neon_requantize(vaddq_s32(ta, tb), &c->rqy), c->yzp);
}

/* 8 int16 of each side -> 8 int16 outputs (int32 before the final saturation in out[0..1]). */
NPU_INLINE_NEON void add8(int16x8_t a, int16x8_t b, const struct vadd_consts *c, int32x4_t out[2]) {
  out[0] = add4(vmovl_s16(vget_low_s16(a)), vmovl_s16(vget_low_s16(b)), c);
  out[1] = add4(vmovl_high_s16(a), vmovl_high_s16(b), c);
}

void npu_qs8_vadd__neon(size_t n, const int8_t *a, const int8_t *b, int8_t *y,
                        const struct npu_qadd_params *restrict params) {
  const struct vadd_consts c = vadd_consts_make(params);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const int8x16_t va = vld1q_s8(a + i), vb = vld1q_s8(b + i);
    int32x4_t lo[2], hi[2];
    add8(vmovl_s8(vget_low_s8(va)), vmovl_s8(vget_low_s8(vb)), &c, lo);
    add8(vmovl_high_s8(va), vmovl_high_s8(vb), &c, hi);
    vst1q_s8(y + i, npu_neon_narrow_s8(lo[0], lo[1], hi[0], hi[1]));
  }
  if (i < n) npu_qs8_vadd__scalar(n - i, a + i, b + i, y + i, params);
}

void npu_qs16_vadd__neon(size_t n, const int16_t *a, const int16_t *b, int16_t *y,
                         const struct npu_qadd_params *restrict params) {
  const struct vadd_consts c = vadd_consts_make(params);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    int32x4_t lo[2], hi[2];
    add8(vld1q_s16(a + i), vld1q_s16(b + i), &c, lo);
    add8(vld1q_s16(a + i + 8), vld1q_s16(b + i + 8), &c, hi);
    vst1q_s16(y + i, npu_neon_narrow_s16(lo[0], lo[1]));
    vst1q_s16(y + i + 8, npu_neon_narrow_s16(hi[0], hi[1]));
  }
  if (i < n) npu_qs16_vadd__scalar(n - i, a + i, b + i, y + i, params);
}

#endif /* __aarch64__ */
