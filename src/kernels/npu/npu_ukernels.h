/* The NPU's integer microkernels: one function type per family, the parameter structs, the weight
 * packing API, and the choice of the best variant for this CPU. The variants themselves
 * (npu_<family>__scalar everywhere; __avx2 and __avx512vnni on x86-64; __neon on AArch64, and for
 * the int8-activation GEMMs, the attention scores and the rows dot __neondot with the dot
 * product, for those GEMMs __neoni8mm with the int8 matrix multiply) are listed once in
 * src/kernels/npu/ukernels.inc, which feeds the declarations below, the dispatch in npu_ukernels.c
 * and the tests. Every family has a NEON variant; the CPU backend's kernels (src/kernels/cpu) have
 * AVX2 ones only and run their portable scalar variants on AArch64. Integer-only by contract:
 * requantization is src/kernels/npu/fixedpoint.h. Kernels never allocate and keep no state. */
#ifndef NPU_KERNELS_NPU_NPU_UKERNELS_H
#define NPU_KERNELS_NPU_NPU_UKERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/isa.h" /* NPU_ISA_*, npu_isa_detect */

/* ---- int8 GEMM with fused per-channel requantization -----------------------------------------
 *
 * y[i, n] = requant(bias[n] + sum_k (x[i, k] - x_zero_point) * w[n, k], mult[n], shift[n])
 *           + y_zero_point, saturated to int8 (npu_qs8_gemm) or int16 (npu_qs8_gemm_qs16);
 * requant = npu_requantize() of src/kernels/npu/fixedpoint.h.
 *
 * x: int8 [m, k], per-tensor asymmetric, row i at x + i * x_stride (x_stride >= k).
 * w: int8 [N, k], symmetric per output channel, values in [-127, 127] (never -128: the AVX2 kernel
 *    multiplies |x| (u8) by sign-adjusted w with vpmaddubsw, whose pairs then stay below 2^15),
 *    packed once by npu_qs8_gemm_pack() into blocks of NR = 16 channels:
 *      block b (channels 16b .. 16b+15, zero-padded past N), kp = k rounded up to KR = 4:
 *        int32 bias[16]                           (0 without bias)
 *        int32 wsum[16]                           sum_k w[n, k], for the zero-point correction
 *        int8  w[kp / 4][16][4]                   w[16b + j][4g + t] at [g][j][t], zero-padded
 *      block size = 128 + 16 * kp bytes (npu_qs8_gemm_packed_size(N, k) = blocks * that).
 *    Each 32-byte row of 8 channels x 4 k is what vpmaddubsw (AVX2), vpdpbusd (AVX512-VNNI, one
 *    ymm) and sdot (NEON dot product, two 16-byte halves) consume, and each 8-byte half of a
 *    16-byte row (2 channels x 4 k) what vmull_s8 (plain NEON) does: the layout is shared by every
 *    variant of the family.
 * Columns [n_begin, n_end) (n_end <= N) are computed, for all m rows; n_begin must be a multiple
 * of 16 (split work across threads in multiples of 16 columns, or split rows by offsetting x and
 * y). No scratch memory is needed.
 * y: row i at y + i * y_stride (in elements); only columns [n_begin, n_end) are written.
 *
 * Valid ranges: k in [1, 32768]; |bias| <= 2^30 (so no int32 accumulator can overflow);
 * x_zero_point in [-128, 127]; y_zero_point in the output type's range; mult/shift as in
 * fixedpoint.h, indexed by the absolute channel n. m == 0 or n_begin >= n_end does nothing. */
#define NPU_QS8_GEMM_NR 16
#define NPU_QS8_GEMM_KR 4
#define NPU_QS8_GEMM_MAX_K 32768 /* the largest k it (and npu_qs8_gemm_pack) takes */

struct npu_qs8_gemm_params {
  const int32_t *mult;  /* [N] per output channel, [0, INT32_MAX] */
  const int32_t *shift; /* [N] per output channel, [-31, 30] */
  int32_t x_zero_point; /* [-128, 127] */
  int32_t y_zero_point; /* [-128, 127] (int8 output) or [-32768, 32767] (int16 output) */
};

typedef void npu_qs8_gemm_fn(size_t m, size_t n_begin, size_t n_end, size_t k,
                             const int8_t *restrict x, size_t x_stride,
                             const void *restrict w_packed, int8_t *restrict y, size_t y_stride,
                             const struct npu_qs8_gemm_params *restrict params);
typedef void npu_qs8_gemm_qs16_fn(size_t m, size_t n_begin, size_t n_end, size_t k,
                                  const int8_t *restrict x, size_t x_stride,
                                  const void *restrict w_packed, int16_t *restrict y,
                                  size_t y_stride,
                                  const struct npu_qs8_gemm_params *restrict params);

/* Bytes of the packed form of an [n, k] weight matrix. */
size_t npu_qs8_gemm_packed_size(size_t n, size_t k);

/* Pack int8 weights w [n, k] (row r at w + r * k) and optional int32 bias [n] (NULL: zero) into
 * 'packed_out' (npu_qs8_gemm_packed_size(n, k) bytes, any alignment; 32 bytes is best). Integer
 * only, done once at compile time. Return false, with 'packed_out' unspecified, if a weight is
 * -128, k is 0 or above 32768, or a bias is beyond +-2^30. */
bool npu_qs8_gemm_pack(size_t n, size_t k, const int8_t *restrict w, const int32_t *restrict bias,
                       void *restrict packed_out);

/* Columns [c0, c1) of row r (< n) of a packed [n, k] matrix, as int8 (the inverse of the packing,
 * for a gather that reads a tied embedding out of the classifier's packed weights). */
void npu_qs8_gemm_unpack_row(size_t k, const void *restrict packed, size_t r, size_t c0, size_t c1,
                             int8_t *restrict out);

/* The int32 bias of row r (< n) of a packed [n, k] matrix, as packed. */
int32_t npu_qs8_gemm_bias(size_t k, const void *restrict packed, size_t r);

/* ---- int4-weight GEMMs (w4a8, w4a16) and the int16-activation GEMM (w8a16) ------------------
 *
 * qc4w packed layout (npu_qc4w_gemm_pack): int4 weights w[n, k] in [-8, 7], symmetric per output
 * channel, either per channel only (block = 0) or, for w4a16, with per-(channel, 32-k block)
 * integer scales q[n][b] in [0, 15], b = k / 32 (block = NPU_QC4W_BLOCK, Qualcomm's LPBQ: the real
 * weight is s_channel * q[n][b] * w[n, k]). Blocks of NR = 16 channels (zero-padded past N);
 * kp = k rounded up to 8 (block 0) or to 32 (block 32); each 16-channel block is
 *     int32 bias[16]                  (0 without bias)
 *     int32 wsum[16]                  sum_k q[n][k / 32] * w[n, k] (q = 1 for block 0): the
 *                                     zero-point correction of qs8_qc4w_gemm
 *   then, block 0:  kp / 8 nibble pairs, one after another;
 *         block 32: for each 32-k chunk, uint8 q[16] (q of channel j for the chunk) followed by
 *                   the chunk's 4 nibble pairs.
 * A nibble pair p covers k = 8p .. 8p+7 in 64 bytes: byte [j * 4 + t] (channel j < 16, t < 4) =
 *     (w[n0 + j][8p + t] + 8) | ((w[n0 + j][8p + 4 + t] + 8) << 4)
 * (offset binary; padding is 8, i.e. weight 0). The low nibbles of a pair are group 2p of the
 * int8 layout above ([16][4], 4 k per channel) and the high nibbles group 2p + 1, so a kernel
 * decodes a pair into two int8 groups with one AND, one 16-bit shift and a subtraction of 8
 * (AVX2: vpand / vpsrlw 4 / vpsubb; NEON: vandq_u8 / vshrq_n_u8 / vsubq_s8), or straight into
 * int16 after a zero extension (vpmovzxbw, vmovl_u8). Block size:
 * npu_qc4w_gemm_block_size(k, block) bytes = 128 + 8 * kp (block 0), 128 + 272 * kp / 32
 * (block 32).
 *
 * npu_qs8_qc4w_gemm, npu_qs8_qc4w_gemm_qs16 (w4a8): exactly npu_qs8_gemm / npu_qs8_gemm_qs16 (same
 * signature, params, ranges, column range and outputs) with qc4w weights packed with block 0:
 *   y[i, n] = requant(bias[n] + sum_k (x[i, k] - x_zero_point) * w[n, k]) ...
 * (|x - zx| <= 255, |w| <= 8, k <= 32768: no int32 sum can overflow).
 *
 * npu_qs16_gemm_qs16 (w8a16): x int16 [m, k], symmetric (zero point 0) per tensor, row i at
 * x + i * x_stride; weights int8 in [-127, 127] packed by npu_qs8_gemm_pack (the int8 layout
 * above; its wsum is read only by the AVX512-VNNI variant, below); output int16:
 *   acc[i, n] = bias[n] + sum_k x[i, k] * w[n, k]                      (exact: int64)
 *   y[i, n]   = npu_requantize_s16(npu_narrow(acc, acc_shift), mult[n], shift[n], y_zero_point)
 * npu_narrow of fixedpoint.h; choose acc_shift at compile time so that the bound of |acc| after
 * it fits int32 (|acc| < 2^30 + k * 32768 * 127).
 *
 * npu_qs16_qc4w_gemm_qs16 (w4a16, w4a16-block): x as for qs16_gemm_qs16; qc4w weights packed
 * with params->block (0 or 32, the same as at packing):
 *   acc[i, n] = bias[n] + sum_b q[n][b] * sum_{k in block b} x[i, k] * w[n, k]
 *                                                        (int64; q = 1 when block == 0)
 *   y[i, n] as for qs16_gemm_qs16.
 *
 * Integer sums are exact in any order, so the SIMD variants accumulate in int32 where no partial
 * sum can overflow and widen to int64 at least every 512 k (NPU_QS16_GEMM_KC):
 *   w8a16: a product is below 32768 * 127 < 2^22 in magnitude; an int32 lane adding pair sums
 *          (vpmaddwd, NEON vmlal pairs) sees 2 products per 4 k in the [16][4] layout, so over
 *          512 k below 256 * 2 * 32768 * 127 < 2^31;
 *   w4a16: a 32-k block dot is below 32 * 32768 * 8 = 2^23, times q <= 15 below 2^27; 16 blocks
 *          (512 k) below 2^31.
 * AVX2 (qs16_gemm_x86.h): a 16-byte quarter of a 4-k group (4 channels x 4 k) sign-extended
 * (vpmovsxbw; int4: the nibbles zero-extended by vpmovzxbw, masked or shifted, minus 8) is one
 * ymm of int16 whose vpmaddwd with the broadcast group x0 x1 x2 x3 gives channel j's two pair
 * sums in lanes 2j, 2j + 1 (NEON: vmull_s16 / vmlal_s16 and a pairwise add); vphaddd adds them
 * when a span is folded into int64. With block scales a 32-k chunk's lanes are multiplied by q
 * (vpmulld; NEON vmulq_s32) before they join the span's.
 * The AVX512-VNNI variants instead split each int16 x into bytes, x = 256 (hi + 128) + lo - 32768
 * (lo, hi + 128 unsigned), so that vpdpbusd (u8 x s8; NEON: usdot, or sdot with the offset on lo
 * instead) multiplies them with the int8 or decoded int4 weights directly:
 *   sum_k x w = 256 A + B - 32768 wsum,   A = sum_k (hi + 128) w,   B = sum_k lo w,
 * which relies on the packed head's wsum (sum_k q w) and on A, B fitting int32 lanes for every
 * k <= 32768 (|A|, |B| <= 32768 * 255 * 127 < 2^31; w4a16: <= 32768 * 255 * 8 * 15 < 2^31).
 * The w4a8 variants decode the nibble pairs and then run the int8 GEMM's steps (vpmaddubsw with
 * vpsignb, or vpdpbusd of x + 128 with the zero point and the 128 folded into
 * bias - (x_zero_point + 128) * wsum): the head's wsum for block 0 is sum_k w.
 * Ranges: k in [1, 32768]; |bias| <= 2^30; acc_shift in [0, 32]; y_zero_point in [-32768,
 * 32767]; mult/shift as in fixedpoint.h. Columns [n_begin, n_end), n_begin a multiple of 16, y
 * row i at y + i * y_stride elements, as for npu_qs8_gemm. No scratch memory. */
#define NPU_QC4W_BLOCK 32    /* the k block of the LPBQ scales */
#define NPU_QS16_GEMM_KC 512 /* the SIMD variants' int32 partial sums span at most this many k */

/* kp of the qc4w layout: k rounded up to 8 (block 0) or to 32 (block 32). */
static inline size_t npu_qc4w_gemm_kp(size_t k, size_t block) {
  const size_t r = block != 0 ? NPU_QC4W_BLOCK : 8;
  return (k + r - 1) / r * r;
}

/* Bytes of one 16-channel block of the qc4w layout. */
static inline size_t npu_qc4w_gemm_block_size(size_t k, size_t block) {
  const size_t kp = npu_qc4w_gemm_kp(k, block);
  return 2 * NPU_QS8_GEMM_NR * sizeof(int32_t) +
         (block != 0 ? kp / NPU_QC4W_BLOCK * (NPU_QS8_GEMM_NR + 4 * 64) : kp * 8);
}

struct npu_qs16_gemm_params {
  const int32_t *mult;  /* [N] per output channel, [0, INT32_MAX] */
  const int32_t *shift; /* [N] per output channel, [-31, 30] */
  int32_t acc_shift;    /* [0, 32]: npu_narrow's right shift of the int64 accumulator */
  int32_t y_zero_point; /* [-32768, 32767] */
  int32_t block;        /* qs16_qc4w_gemm_qs16: 0 or NPU_QC4W_BLOCK, as packed; else 0 */
};

typedef npu_qs8_gemm_fn npu_qs8_qc4w_gemm_fn;
typedef npu_qs8_gemm_qs16_fn npu_qs8_qc4w_gemm_qs16_fn;
typedef void npu_qs16_gemm_qs16_fn(size_t m, size_t n_begin, size_t n_end, size_t k,
                                   const int16_t *restrict x, size_t x_stride,
                                   const void *restrict w_packed, int16_t *restrict y,
                                   size_t y_stride,
                                   const struct npu_qs16_gemm_params *restrict params);
typedef npu_qs16_gemm_qs16_fn npu_qs16_qc4w_gemm_qs16_fn;

/* Bytes of the qc4w packed form of an [n, k] int4 matrix with k block 'block' (0 or 32). */
size_t npu_qc4w_gemm_packed_size(size_t n, size_t k, size_t block);

/* Pack int4 weights w [n, k] (values in [-8, 7], one per int8, row r at w + r * k), optional
 * int32 bias [n] (NULL: zero) and, for block 32, the block scales bscale [n][ceil(k / 32)]
 * (values in [0, 15]; NULL iff block == 0) into 'packed_out' (npu_qc4w_gemm_packed_size bytes,
 * any alignment). Return false, with 'packed_out' unspecified, for a weight or scale out of range,
 * k of 0 or above 32768, a bias beyond +-2^30, block not 0 or 32, or bscale NULL-ness not matching
 * block. */
bool npu_qc4w_gemm_pack(size_t n, size_t k, const int8_t *restrict w, const int32_t *restrict bias,
                        size_t block, const uint8_t *restrict bscale, void *restrict packed_out);

/* Columns [c0, c1) of row r (< n) of a qc4w-packed [n, k] matrix: the int4 values w (not
 * multiplied by the block scales), as int8. */
void npu_qc4w_gemm_unpack_row(size_t k, size_t block, const void *restrict packed, size_t r,
                              size_t c0, size_t c1, int8_t *restrict out);

/* The block scales q[r][b] (b < ceil(k / 32)) of row r of a qc4w-packed [n, k] matrix packed with
 * block 32, and the int32 bias of row r of one packed with 'block', as packed. */
void npu_qc4w_gemm_unpack_scales(size_t k, const void *restrict packed, size_t r,
                                 uint8_t *restrict out);
int32_t npu_qc4w_gemm_bias(size_t k, size_t block, const void *restrict packed, size_t r);

/* ---- standalone requantization of int32 values -------------------------------------------------
 * y[i] = sat(npu_requantize(acc[i], mult[i], shift[i]) + zero_point): per-element multipliers
 * (pass arrays of one repeated value for per-tensor). Ranges as in fixedpoint.h. */
typedef void npu_qs32_requant_qs8_fn(size_t n, const int32_t *restrict acc,
                                     const int32_t *restrict mult, const int32_t *restrict shift,
                                     int32_t zero_point, int8_t *restrict y);
typedef void npu_qs32_requant_qs16_fn(size_t n, const int32_t *restrict acc,
                                      const int32_t *restrict mult, const int32_t *restrict shift,
                                      int32_t zero_point, int16_t *restrict y);

/* ---- element-wise add with requantization (TFLite's integer add) ------------------------------
 * With real scales sa, sb, sy and s = 2 * max(sa, sb):
 *   ta = npu_requantize((a - a_zero_point) * 2^left_shift, a_mult, a_shift)      ~ sa / s
 *   tb = npu_requantize((b - b_zero_point) * 2^left_shift, b_mult, b_shift)      ~ sb / s
 *   y  = sat(npu_requantize(ta + tb, y_mult, y_shift) + y_zero_point)  ~ s / (2^left_shift * sy)
 * Valid ranges: input multipliers at most 0.5 (a_shift <= -1, or 0 with a_mult <= 2^30; same for
 * b); |x - zero_point| * 2^left_shift < 2^30 for every input (int8: left_shift <= 22, 20 is
 * TFLite's; int16: left_shift <= 14), so |ta + tb| < 2^30 never overflows; y_* as in
 * fixedpoint.h. Make the params with npu_qadd_params_make() (src/program/qparams.h). y may be a
 * or b (in place); no other overlap. */
struct npu_qadd_params {
  int32_t a_zero_point, b_zero_point;
  int32_t left_shift;
  int32_t a_mult, a_shift;
  int32_t b_mult, b_shift;
  int32_t y_mult, y_shift, y_zero_point;
};

typedef void npu_qs8_vadd_fn(size_t n, const int8_t *a, const int8_t *b, int8_t *y,
                             const struct npu_qadd_params *restrict params);
typedef void npu_qs16_vadd_fn(size_t n, const int16_t *a, const int16_t *b, int16_t *y,
                              const struct npu_qadd_params *restrict params);

/* ---- element-wise multiply with requantization ------------------------------------------------
 *   y = sat(npu_requantize((a - a_zero_point) * (b - b_zero_point), y_mult, y_shift)
 *           + y_zero_point),   y_mult/y_shift ~ sa * sb / sy.
 * Valid ranges: int8: zero points in [-128, 127]; int16: input zero points 0 (so the product fits
 * in int32). y may be a or b (in place); no other overlap. */
struct npu_qmul_params {
  int32_t a_zero_point, b_zero_point;
  int32_t y_mult, y_shift, y_zero_point;
};

typedef void npu_qs8_vmul_fn(size_t n, const int8_t *a, const int8_t *b, int8_t *y,
                             const struct npu_qmul_params *restrict params);
typedef void npu_qs16_vmul_fn(size_t n, const int16_t *a, const int16_t *b, int16_t *y,
                              const struct npu_qmul_params *restrict params);

/* ---- lookup-table activation ------------------------------------------------------------------
 * y[i] = table[x[i] + 128]: any int8 -> int8 function with its quantization folded in (SiLU:
 * npu_lut_s8_build() in src/program/qparams.h). y may be x (in place); no other overlap. */
typedef void npu_x8_lut_fn(size_t n, const int8_t *x, int8_t *y, const int8_t *restrict table);

/* ---- int16 lookup-table activation (piecewise linear) -----------------------------------------
 * For each x: u = x + 32768, i = u >> 7 (in [0, 511]), f = u & 127,
 *   y = t[i] + (((t[i + 1] - t[i]) * f + 64) >> 7)      (arithmetic shift)
 * over a table t of 513 int16 (npu_lut_s16_build() in src/program/qparams.h): linear
 * interpolation between the 513 knots, any int16 -> int16 function (SiLU) with its quantization
 * folded in. The result lies between t[i] and t[i + 1] (|d * f / 128| <= |d|), so it needs no
 * saturation; (t[i + 1] - t[i]) * f fits int32 (< 2^16 * 2^7). y may be x (in place); no other
 * overlap. AVX2: a 32-bit gather at t + i reads the pair (t[i], t[i + 1]) in one lane. */
#define NPU_QS16_LUT_SIZE 513

typedef void npu_qs16_lut_fn(size_t n, const int16_t *x, int16_t *y, const int16_t *restrict table);

/* ---- gather rows with per-row requantization (embeddings) -------------------------------------
 * y[t, c] = sat(npu_requantize(table[ids[t], c], mult[ids[t]], shift[ids[t]]) + y_zero_point)
 * for t < n_ids, c < cols: 'table' int8 [n_rows, cols] (row r at table + r * cols, symmetric
 * per row), mult/shift ~ row scale / output scale. y row t at y + t * y_stride (elements).
 * ids must lie in [0, n_rows) (asserted: validate token ids before running a graph). */
struct npu_qs8_gather_params {
  const int32_t *mult;  /* [n_rows] */
  const int32_t *shift; /* [n_rows] */
  int32_t y_zero_point;
};

typedef void npu_qs8_gather_fn(size_t n_ids, const int32_t *restrict ids, size_t n_rows,
                               size_t cols, const int8_t *restrict table, int8_t *restrict y,
                               size_t y_stride,
                               const struct npu_qs8_gather_params *restrict params);
typedef void npu_qs8_gather_qs16_fn(size_t n_ids, const int32_t *restrict ids, size_t n_rows,
                                    size_t cols, const int8_t *restrict table, int16_t *restrict y,
                                    size_t y_stride,
                                    const struct npu_qs8_gather_params *restrict params);

/* ---- RMSNorm of int16 rows into int8 ---------------------------------------------------------
 * The normalization in front of every matmul block, in integers, on the residual stream: x int16
 * [rows, cols] symmetric (zero point 0) with scale sx; y int8 [rows, cols] with scale sy and zero
 * point y_zero_point. The real op y = x / sqrt(mean(x^2) + eps) * g[c] becomes, per row,
 *   v    = sum_c x[c]^2 + eps                       (int64; eps ~ cols * eps_real / sx^2, >= 1)
 *   r, e = npu_rsqrt_q61(v)                          1 / sqrt(v) ~ r * 2^(e - 61) (fixedpoint.h)
 *   u[c] = (x[c] * r + 2^14) >> 15                   (int64 product, |u| < 2^31)
 *   s    = 77 - e - shift                            the row's total right shift
 *   y[c] = sat_int8(((u[c] * mult[c] + 2^(s-1)) >> s) + y_zero_point)   (0 + zp when s > 62)
 * with mult[c] * 2^(shift - 31) ~ g[c] * sqrt(cols) / sy: one signed multiplier per channel
 * (|mult| <= INT32_MAX, any sign: the weights of a norm may be negative) and one shift for the
 * tensor, so |u * mult| < 2^62. Valid ranges: cols in [1, 2^24]; eps in [1, 2^62]; shift in
 * [-16, 46] (so s >= 1); y_zero_point in [-128, 127]. Make the params with
 * npu_rmsnorm_params_make() (src/program/qparams.h). No overlap of x and y. */
#define NPU_QS16_RMSNORM_MAX_COLS (1 << 24) /* the widest row it takes */

struct npu_qs16_rmsnorm_params {
  const int32_t *mult; /* [cols] */
  int64_t eps;
  int32_t shift;
  int32_t y_zero_point;
};

typedef void npu_qs16_rmsnorm_qs8_fn(size_t rows, size_t cols, const int16_t *restrict x,
                                     int8_t *restrict y,
                                     const struct npu_qs16_rmsnorm_params *restrict params);

/* The same RMSNorm into int16 (qs16_rmsnorm_qs16): the same params and row arithmetic
 * (npu_rmsnorm_value of fixedpoint.h), saturated to int16 with y_zero_point in [-32768, 32767]:
 *   y[c] = sat_int16(((u[c] * mult[c] + 2^(s-1)) >> s) + y_zero_point). */
typedef void npu_qs16_rmsnorm_qs16_fn(size_t rows, size_t cols, const int16_t *restrict x,
                                      int16_t *restrict y,
                                      const struct npu_qs16_rmsnorm_params *restrict params);

/* ---- attention: scores, softmax, weighted values over a context bucket -----------------------
 * The three attention ops of a step of 'rows' tokens over a bucket of 'ctx' cache positions, in
 * the graph's layouts: q [rows, heads * head_dim]; the K and V caches [ctx, kv_heads * head_dim]
 * (int8 copies the CPU quantized for this step); scores and probabilities [heads, rows, ctx];
 * the output [rows, heads * head_dim]. Query head h reads K/V head h / (heads / kv_heads)
 * (grouped-query attention). Row t of a step that starts at cache position pos0 with n_valid real
 * rows sees keys j < len(t) = pos0 + min(t, n_valid - 1) + 1: causal, and a padded row
 * (t >= n_valid) sees what the last real row sees, so no kernel reads a cache row at or past
 * pos0 + n_valid (the copies hold only those rows). */
struct npu_attn_shape {
  int32_t heads, kv_heads, head_dim; /* heads a multiple of kv_heads; head_dim in [1, 32768] */
  int32_t rows, ctx;
  int32_t pos0, n_valid; /* 1 <= n_valid <= rows; pos0 >= 0; pos0 + n_valid <= ctx */
};

/* len(t) of the shape above. */
static inline int32_t npu_attn_len_of(const struct npu_attn_shape *shape, int32_t t) {
  return shape->pos0 + (t < shape->n_valid ? t : shape->n_valid - 1) + 1;
}

/* Scores: for j < len(t)
 *   s[h, t, j] = sat_int16(npu_requantize(sum_i (q[t, h, i] - q_zero_point)
 *                                               * (k[j, h / group, i] - k_zero_point),
 *                                         mult, shift) + s_zero_point)
 * (mult/shift ~ q_scale * k_scale * 1/sqrt(head_dim) / s_scale), and the mask
 * s[h, t, j] = NPU_ATTN_MASKED for len(t) <= j < ctx. Zero points in [-128, 127]; the int32 sum
 * cannot overflow (255^2 * 32768 < 2^31). */
#define NPU_ATTN_MASKED INT16_MIN

struct npu_qs8_qk_params {
  int32_t q_zero_point, k_zero_point;
  int32_t mult, shift;  /* fixedpoint.h ranges */
  int32_t s_zero_point; /* [-32768, 32767] */
};

typedef void npu_qs8_qk_qs16_fn(const struct npu_attn_shape *restrict shape,
                                const int8_t *restrict q, const int8_t *restrict k,
                                int16_t *restrict s,
                                const struct npu_qs8_qk_params *restrict params);

/* Softmax of int16 scores into Q15 probabilities (real p = q * 2^-15, zero point 0), over the
 * first len(t) entries of each row, in fixed point. With m the row's maximum over j < len and
 * r = the bit width of len (len < 2^r):
 *   d_j = m - s_j                                   in [0, 65535]
 *   u_j = npu_requantize(d_j, mult, shift)          d_j * s_scale / ln 2 in 1/256ths of an octave
 *   e_j = npu_exp2_q30[u_j & 255] >> min((u_j >> 8) + r, 31)      2^-(u_j / 256) in Q(30 - r)
 *   sum = sum_j e_j                                 < 2^30 (e_j <= 2^(30 - r), len < 2^r)
 *   inv = floor(2^(60 - r) / sum)                   <= 2^30 (sum >= e of the maximum = 2^(30-r))
 *   p_j = min(floor((e_j * inv + 2^(44 - r)) / 2^(45 - r)), 32767)  ~ round(2^15 * e_j / sum)
 * (e_j * inv < 2^60 in int64) and p_j = 0 for len <= j < ctx. The input's zero point cancels in
 * d_j. mult/shift (fixedpoint.h ranges) ~ s_scale * 256 / ln 2; a multiplier that saturates only
 * makes far-below-maximum entries 0. len < 2^24. */
#define NPU_QS16_SOFTMAX_MAX_LEN ((1 << 24) - 1) /* the longest row it takes */
#define NPU_PROB_BITS 15 /* probabilities are Q15: scale 2^-15, zero point 0, in [0, 32767] */

struct npu_qs16_softmax_params {
  int32_t mult, shift;
};

/* round(2^30 * 2^(-f / 256)) for f in [0, 255]: the exponential of the integer softmax. */
extern const int32_t npu_exp2_q30[256];

typedef void npu_qs16_softmax_fn(const struct npu_attn_shape *restrict shape,
                                 const int16_t *restrict s, int16_t *restrict p,
                                 const struct npu_qs16_softmax_params *restrict params);

/* Weighted values: for every t, h, i
 *   out[t, h, i] = sat_int8(npu_requantize(sum_{j < len(t)} p[h, t, j]
 *                                             * (v[j, h / group, i] - v_zero_point),
 *                                          mult, shift) + y_zero_point)
 * (mult/shift ~ 2^-15 * v_scale / y_scale). p holds probabilities: values in [0, 32767] whose
 * sum over a row is at most 2^16 (any softmax output), so |sum| <= 2^16 * 255 never overflows.
 * Zero points in [-128, 127]. */
struct npu_qs16_pv_params {
  int32_t v_zero_point;
  int32_t mult, shift;
  int32_t y_zero_point;
};

typedef void npu_qs16_pv_qs8_fn(const struct npu_attn_shape *restrict shape,
                                const int16_t *restrict p, const int8_t *restrict v,
                                int8_t *restrict out,
                                const struct npu_qs16_pv_params *restrict params);

/* ---- sparse decode over neuron bundles (PowerInfer-style) ------------------------------------
 * FFN neuron j of a layer is three int8 vectors: its gate row, its up row and its down column,
 * each kp = npu_bundle_kp(k) bytes (k the model width), 64-byte aligned, zero past k; weights lie
 * in [-127, 127] (never -128). Where they lie is the caller's (program/sparse_data.h: in clusters
 * of neurons). A decode step computes the gate dot products of the candidate neurons a predictor
 * chose (qs8_rows_dot over their gate rows), keeps those whose gate passes the thresholds,
 * computes the up dot products of the kept (qs8_rows_dot over their up rows), applies the
 * activation to get one coefficient per kept neuron, then adds the kept down columns times their
 * coefficients (qs8_cols_down): each step reads only the chosen neurons' vectors.
 *
 * npu_qs8_rows_dot: for i < count, acc[i] = sum_{c < k} (x[c] - x_zero_point) * rows[i][c].
 * x is exactly k bytes (never read past k); the rows may be read up to kp. k in [1, 32768],
 * x_zero_point in [-128, 127]: a product is at most 255 * 127 in magnitude, so a sum at most
 * 32768 * 255 * 127 < 2^30 and no int32 overflows. count == 0 does nothing.
 *
 * npu_qs8_cols_down: for c < k,
 *   acc[c] += sum_{i < count} coef[i] * cols[i][c]
 * the columns read up to kp; coef[i] in [-255, 255], count <= 65536: a product is at most
 * 255 * 127 = 32385 in magnitude, the sum at most 65536 * 32385 < 2^31; the caller keeps
 * |acc[c]| + count * 32385 below 2^31 (e.g. acc zeroed), so no int32 overflows and every order of
 * summation gives the same bits. acc[c] for c >= k is not touched. */
#define NPU_BUNDLE_ALIGN 64             /* bundle alignment, and what kp is rounded up to */
#define NPU_BUNDLE_MAX_K 32768          /* the largest k the bundle kernels take */
#define NPU_BUNDLE_DOWN_MAX_COUNT 65536 /* the most columns one qs8_cols_down call adds */

/* Bytes of each of a neuron's three vectors: k rounded up to a multiple of 64. */
size_t npu_bundle_kp(size_t k);

/* Down projection of 'count' neurons: acc[c] += sum_i coef[i] * cols[i][c] for c < k, coef[i] in
 * [-255, 255]; count <= 65536. */
typedef void npu_qs8_cols_down_fn(size_t k, size_t count, const int8_t *const *cols,
                                  const int32_t *coef, int32_t *acc);

/* Dot products of 'count' int8 rows with one int8 input x (k values, zero point x_zero_point):
 * acc[i] = sum_{c<k} (x[c] - x_zero_point) * rows[i][c]. Each row is 64-byte aligned and readable
 * up to npu_bundle_kp(k) bytes (zero past k); x is exactly k bytes. k in [1, NPU_BUNDLE_MAX_K].
 * The rows are a bundle's gate or up row (sparse decode computes the gate rows of the candidate
 * neurons, then the up rows of the kept ones), or any rows of that shape, in any order, repeats
 * allowed; weights in [-127, 127], x_zero_point in [-128, 127], so a sum is at most
 * 32768 * 255 * 127 < 2^30 in magnitude. acc[i] for i >= count is not touched. */
typedef void npu_qs8_rows_dot_fn(size_t k, const int8_t *x, int32_t x_zero_point, size_t count,
                                 const int8_t *const *rows, int32_t *acc);

/* ---- input-sparse GEMV over channel-major weights (TEAL-style) ------------------------------
 * A decode step (one token) thresholds a matmul's integer input by magnitude and reads only the
 * weights of the input channels it keeps. For that the weights of an [N, k] matrix (N outputs, k
 * input channels) are held channel-major: row c (channel c < k) holds that channel's weights for
 * every output n < np = npu_qcol_np(N) (N rounded up to NPU_QCOL_NR = 64), so a kept channel's
 * bytes are one contiguous run.
 *   8-bit: row c at cols + c * row_stride (row_stride >= np, a multiple of 64); int8 w[n, c] at
 *          byte n of row c, 0 past N; weights in [-127, 127].
 *   4-bit: row c at cols + c * row_stride (row_stride >= np / 2, a multiple of 32), in chunks of
 *          32 bytes per 64 outputs: byte j (< 32) of chunk t holds output 64t + j in its low nibble
 *          and output 64t + 32 + j in its high nibble, offset binary (nibble = w + 8, w in
 *          [-8, 7]); padding past N is nibble 8 (weight 0). AND 0x0F / shift right 4 of a chunk
 *          give outputs 64t .. 64t+31 and 64t+32 .. 64t+63 in order, no interleave (NEON: two
 *          16-byte halves).
 * npu_qcol8_gemv: for n in [n0, n1),
 *   acc[n - n0] += sum_{i < count} d[i] * w[n, idx[i]]
 * npu_qcol4_gemv: the same with the int4 weights when q == NULL; with q != NULL
 *   acc[n - n0] += q[n] * sum_{i < count} d[i] * w[n, idx[i]]
 * q uint8 indexed by the absolute n (< np), values in [0, 15]: the LPBQ block scales of one
 * 32-channel block (the caller makes one call per block with that block's kept channels).
 * Ranges: n0 and n1 multiples of 64 with n0 <= n1 <= np (split [0, np) across threads in multiples
 * of 64); count >= 0 (0 does nothing); idx[i] < k, any order, repeats allowed; d any int16. The
 * caller guarantees that no int32 overflows, |acc[n]| + sum_i |d[i]| * 127 < 2^31 (8-bit),
 * |acc[n]| + 15 * sum_i |d[i]| * 8 < 2^31 (4-bit); under that every order of summation gives the
 * same bits, and every variant is bit-exact with npu_qcol*_gemv__scalar. acc[j] for j >= n1 - n0
 * is not touched. No scratch memory (a fixed-size stack buffer at most). */
#define NPU_QCOL_NR 64 /* outputs are padded to a multiple of this: np = N rounded up */

/* np: n rounded up to a multiple of NPU_QCOL_NR. */
static inline size_t npu_qcol_np(size_t n) {
  return (n + NPU_QCOL_NR - 1) / NPU_QCOL_NR * NPU_QCOL_NR;
}

/* Bytes of one channel row: np (w_bits 8) or np / 2 (w_bits 4). */
static inline size_t npu_qcol_row_bytes(size_t n, unsigned w_bits) {
  return w_bits == 4 ? npu_qcol_np(n) / 2 : npu_qcol_np(n);
}

typedef void npu_qcol8_gemv_fn(size_t n0, size_t n1, size_t count, const int32_t *restrict idx,
                               const int16_t *restrict d, const int8_t *restrict cols,
                               size_t row_stride, int32_t *restrict acc);
typedef void npu_qcol4_gemv_fn(size_t n0, size_t n1, size_t count, const int32_t *restrict idx,
                               const int16_t *restrict d, const uint8_t *restrict cols,
                               size_t row_stride, const uint8_t *restrict q, int32_t *restrict acc);

/* Bytes of the channel-major form of an [n, k] matrix, rows packed (row_stride = row bytes):
 * k * npu_qcol_row_bytes(n, w_bits). */
size_t npu_qcol_size(size_t n, size_t k, unsigned w_bits);

/* The channel-major copy (row_stride = npu_qcol_row_bytes(n, 8)) of a qs8-packed [n, k] matrix
 * (npu_qs8_gemm_pack's layout, k in [1, 32768]) into 'cols_out' (npu_qcol_size(n, k, 8) bytes).
 * Done once at load time (0.4-0.8 s per GB on one core). Return false on an allocation failure
 * ('cols_out' unspecified); the present code allocates nothing and always returns true. */
bool npu_qcol8_from_packed(size_t n, size_t k, const void *packed, int8_t *cols_out);

/* The channel-major copy (row_stride = npu_qcol_row_bytes(n, 4)) of a qc4w-packed [n, k] matrix
 * packed with 'block' (0 or 32) into 'cols_out' (npu_qcol_size(n, k, 4) bytes) and, for block 32,
 * its block scales as q_out[b * np + n] (b < ceil(k / 32), n < np, 0 past n: ceil(k / 32) * np
 * bytes; 'q_out' unused and may be NULL for block 0). Return false on an allocation failure, as
 * npu_qcol8_from_packed (none today). */
bool npu_qcol4_from_packed(size_t n, size_t k, size_t block, const void *packed, uint8_t *cols_out,
                           uint8_t *q_out);

/* ---- variants and dispatch --------------------------------------------------------------------*/

/* Whether this compiler builds the AArch64 variants that need the dot product (__neondot) or the
 * int8 matrix multiply (__neoni8mm), which are chosen at run time: GCC gives their intrinsics to a
 * function with a target attribute (neon_util.h); clang 14's arm_neon.h only where the whole file
 * is compiled for the extension (-march=armv8.2-a+dotprod, +i8mm), so a clang build without them
 * leaves those variants out and runs the plain NEON ones. */
#if defined(__aarch64__) && (!defined(__clang__) || defined(__ARM_FEATURE_DOTPROD))
#define NPU_NEON_DOTPROD_VARIANTS 1
#else
#define NPU_NEON_DOTPROD_VARIANTS 0
#endif
#if NPU_NEON_DOTPROD_VARIANTS && (!defined(__clang__) || defined(__ARM_FEATURE_MATMUL_INT8))
#define NPU_NEON_I8MM_VARIANTS 1
#else
#define NPU_NEON_I8MM_VARIANTS 0
#endif

/* Declarations of every variant: npu_qs8_gemm__scalar, npu_qs8_gemm__avx2, ... */
#define NPU_UKERNEL(family, variant, isa) npu_##family##_fn npu_##family##__##variant;
#include "kernels/npu/npu_ukernels.inc"
#undef NPU_UKERNEL

/* The chosen variant of each family. */
struct npu_ukernels {
  npu_qs8_gemm_fn *qs8_gemm;
  npu_qs8_gemm_qs16_fn *qs8_gemm_qs16;
  npu_qs32_requant_qs8_fn *qs32_requant_qs8;
  npu_qs32_requant_qs16_fn *qs32_requant_qs16;
  npu_qs8_vadd_fn *qs8_vadd;
  npu_qs16_vadd_fn *qs16_vadd;
  npu_qs8_vmul_fn *qs8_vmul;
  npu_qs16_vmul_fn *qs16_vmul;
  npu_x8_lut_fn *x8_lut;
  npu_qs8_gather_fn *qs8_gather;
  npu_qs8_gather_qs16_fn *qs8_gather_qs16;
  npu_qs8_qk_qs16_fn *qs8_qk_qs16;
  npu_qs16_softmax_fn *qs16_softmax;
  npu_qs16_pv_qs8_fn *qs16_pv_qs8;
  npu_qs16_rmsnorm_qs8_fn *qs16_rmsnorm_qs8;
  npu_qs8_qc4w_gemm_fn *qs8_qc4w_gemm;
  npu_qs8_qc4w_gemm_qs16_fn *qs8_qc4w_gemm_qs16;
  npu_qs16_gemm_qs16_fn *qs16_gemm_qs16;
  npu_qs16_qc4w_gemm_qs16_fn *qs16_qc4w_gemm_qs16;
  npu_qs16_rmsnorm_qs16_fn *qs16_rmsnorm_qs16;
  npu_qs16_lut_fn *qs16_lut;
  npu_qs8_cols_down_fn *qs8_cols_down;
  npu_qs8_rows_dot_fn *qs8_rows_dot;
  npu_qcol8_gemv_fn *qcol8_gemv;
  npu_qcol4_gemv_fn *qcol4_gemv;
};

/* Fill 'uk_out' with, for each family, the last variant in npu_ukernels.inc whose extensions are
 * all in 'isa' (pass npu_isa_detect(), or 0 to force the scalar reference kernels). */
void npu_ukernels_select(uint32_t isa, struct npu_ukernels *uk_out);

/* The variant name ("scalar", "avx2", "avx512vnni", "neon", "neondot", "neoni8mm") of the kernel
 * 'uk' holds for 'family' ("qs8_gemm", ...), for reports; "?" if the family is unknown or no listed
 * variant. */
const char *npu_ukernels_variant(const struct npu_ukernels *uk, const char *family);

#endif /* NPU_KERNELS_NPU_NPU_UKERNELS_H */
