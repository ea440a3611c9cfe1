/* npu_expf: the exponential of attention's softmax, in the reference forward and in every kernel
 * that computes attention. It is defined by its own operations rather than by libm's expf, whose
 * bits differ between C libraries and which has no vector form with the same bits: here one
 * sequence of IEEE single-precision operations is written once, on eight lanes (npu_expf8), and
 * the scalar form is lane 0 of it, so the reference and a vectorized kernel agree bit for bit.
 *
 * Method (Cephes' expf): n = x * log2(e) rounded to the nearest integer (adding and subtracting
 * 1.5 * 2^23), r = x - n * ln 2 in two parts (Cody-Waite: n * C1 is exact), so |r| <= ln(2) / 2;
 * e^r by Cephes' degree-7 polynomial; then times 2^n as two powers of two, each a normal float,
 * so results down in the subnormals round once, as a multiplication does. Inputs are clamped to
 * [-105, 89] first (e^-105 rounds to 0, e^89 overflows to +inf); NaN stays NaN. Within 1 ulp
 * of e^x from -103.9 to 88.72, subnormal results included (test_expf_within_one_ulp in
 * tests/test_ref.c measures it against double-precision exp). Every product is its own
 * statement: no fused multiply-add can form. */
#ifndef NPU_BASE_EXPF_H
#define NPU_BASE_EXPF_H

#include <stdint.h>
#include <string.h>

/* Eight floats and eight int32: lane-wise arithmetic is IEEE single precision / two's complement.
 */
typedef float npu_v8f __attribute__((vector_size(32)));
typedef int32_t npu_v8i __attribute__((vector_size(32)));

#define NPU_V8F(c) ((npu_v8f){(c), (c), (c), (c), (c), (c), (c), (c)})

/* Lanes of a where mask m is set (all ones), else of b. */
#define NPU_V8F_SELECT(m, a, b) ((npu_v8f)(((npu_v8i)(a) & (m)) | ((npu_v8i)(b) & ~(m))))

/* y[l] = e^x[l] for eight lanes (y may be x). Through memory, so that no vector crosses a call
 * boundary (the ABI of one differs with and without AVX); inlined, the copies vanish. */
static inline __attribute__((always_inline)) void npu_expf8(float *y, const float *x) {
  const npu_v8f lo = NPU_V8F(-105.0f), hi = NPU_V8F(89.0f), magic = NPU_V8F(12582912.0f);
  npu_v8f v;
  memcpy(&v, x, sizeof(v));
  const npu_v8i nan = v != v;
  npu_v8f c = NPU_V8F_SELECT(v < lo, lo, v);
  c = NPU_V8F_SELECT(c > hi, hi, c);
  c = NPU_V8F_SELECT(nan, lo, c); /* any finite value: NaN lanes are put back at the end */
  /* n = round(c * log2(e)); r = c - n * ln 2 */
  npu_v8f t = c * NPU_V8F(1.44269504088896341f);
  t = t + magic;
  const npu_v8f n = t - magic;
  npu_v8f nc = n * NPU_V8F(0.693359375f);
  npu_v8f r = c - nc;
  nc = n * NPU_V8F(-2.12194440e-4f);
  r = r - nc;
  /* e^r = 1 + r + r^2 * P(r) */
  const npu_v8f z = r * r;
  npu_v8f p = r * NPU_V8F(1.9875691500e-4f);
  p = p + NPU_V8F(1.3981999507e-3f);
  p = p * r;
  p = p + NPU_V8F(8.3334519073e-3f);
  p = p * r;
  p = p + NPU_V8F(4.1665795894e-2f);
  p = p * r;
  p = p + NPU_V8F(1.6666665459e-1f);
  p = p * r;
  p = p + NPU_V8F(5.0000001201e-1f);
  p = p * z;
  p = p + r;
  p = p + NPU_V8F(1.0f);
  /* times 2^n = 2^n1 * 2^n2, n in [-152, 129]: both halves in [-76, 65], normal floats */
  const npu_v8i ni = __builtin_convertvector(n, npu_v8i);
  const npu_v8i n1 = ni / 2, n2 = ni - n1;
  const npu_v8f s1 = (npu_v8f)((n1 + 127) << 23), s2 = (npu_v8f)((n2 + 127) << 23);
  p = p * s1;
  p = p * s2;
  p = NPU_V8F_SELECT(nan, v, p);
  memcpy(y, &p, sizeof(p));
}

static inline float npu_expf(float x) {
  float v[8] = {x, x, x, x, x, x, x, x};
  npu_expf8(v, v);
  return v[0];
}

#endif /* NPU_BASE_EXPF_H */
