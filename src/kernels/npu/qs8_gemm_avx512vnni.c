/* npu_qs8_gemm__avx512vnni and npu_qs8_gemm_qs16__avx512vnni: the int8 GEMM with AVX512-VNNI's
 * vpdpbusd on 256-bit registers (AVX512VL encoding, so 32 of them). One vpdpbusd adds, per int32
 * lane, the four products of unsigned by signed bytes: exactly one 32-byte row of the packed
 * layout (8 channels x 4 k) times a broadcast 4-byte x group. x is made unsigned as
 * x ^ 0x80 = x + 128 and the offset folded into the accumulator start:
 *   acc = bias - (x_zero_point + 128) * wsum + sum_k (x + 128) * w
 *       = bias + sum_k (x - x_zero_point) * w.
 * No int32 wraps, ever: after the first t groups the running sum is
 *   bias + sum_{j <= t} (x_j + 128 - c) * w_j - c * sum_{j > t} w_j,   c = x_zero_point + 128,
 * every term at most 255 * 127 in magnitude, so |acc| <= 2^30 + 255 * 127 * 32768 < 2^31 at every
 * step for the ranges of npu_ukernels.h (the start included); vpdpbusd's modular sum is then exact.
 * Requantization and stores are the AVX2 kernel's (qs8_gemm_x86.h), so the output is bit-exact
 * with the scalar reference.
 * Tiles: prefill MR = 6 rows x 32 channels (24 accumulators, 4 weight registers, a broadcast:
 * 2 vpdpbusd per cycle on Zen 4, compute-bound); each pair of blocks (32 * kp bytes, in L1 up to
 * k ~ 800, else L2, the same speed measured up to k = 4864) serves all rows before the next pair,
 * so the weights stream from memory once and x (m * k bytes) from L2. No k tiling: it would need
 * int32 partial sums in memory, and the kernels have no scratch. Decode (m = 1, memory-bound):
 * one row x one block, block after block, so that each thread reads its share of the weights as
 * one sequential stream, each byte once by a vpdpbusd with a memory operand. The hardware
 * prefetcher follows one stream better than several: with eight blocks side by side (sharing
 * each broadcast), both threads each streaming half of a 256 MiB matrix ran at 23-29 GB/s, one
 * block at a time at 26-33 and a plain read at 26-34; in a window where the read reached
 * 43-58 GB/s, 31-40 against 42-54. Software prefetch measured no gain. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__x86_64__)

#include "kernels/npu/qs8_gemm_x86.h"
#include "kernels/npu/vnni_util.h"

enum {
  NR = NPU_QS8_GEMM_NR,
  KR = NPU_QS8_GEMM_KR,
  MR = 6, /* rows of a prefill tile */
};

/* x group 'word' (4 int8) as 4 uint8 x + 128, broadcast to the 8 lanes. */
NPU_INLINE_VNNI __m256i x_u8(int32_t word) {
  return _mm256_xor_si256(_mm256_set1_epi32(word), _mm256_set1_epi8((char)0x80));
}

/* vpdpbusd (vnni_util.h). */
#define dpbusd npu_vnni_dpbusd

/* Row r of a prefill tile, one k group: 'xword' its 4 x bytes; w0..w3 the group's weight rows. */
#define ROW_STEP(r, xword)                                                                         \
  do {                                                                                             \
    if (mr > r) {                                                                                  \
      const __m256i xb_ = x_u8(xword);                                                             \
      a##r##0 = dpbusd(a##r##0, xb_, w0);                                                          \
      a##r##1 = dpbusd(a##r##1, xb_, w1);                                                          \
      if (nb > 1) {                                                                                \
        a##r##2 = dpbusd(a##r##2, xb_, w2);                                                        \
        a##r##3 = dpbusd(a##r##3, xb_, w3);                                                        \
      }                                                                                            \
    }                                                                                              \
  } while (0)

/* Requantize and store row r of a prefill tile. */
#define ROW_STORE(r)                                                                               \
  do {                                                                                             \
    if (mr > r) {                                                                                  \
      uint8_t *yr_ = y + r * y_stride * esize;                                                     \
      npu_gemm_store_row(a##r##0, a##r##1, &c[0], yzp, out16, yr_, nb > 1 ? NR : nc_last);         \
      if (nb > 1)                                                                                  \
        npu_gemm_store_row(a##r##2, a##r##3, &c[1], yzp, out16, yr_ + NR * esize, nc_last);        \
    }                                                                                              \
  } while (0)

/* 'mr' rows (1..MR) x 'nb' blocks (1 or 2) of 16 channels, both constants after inlining: rows of
 * x at x + r * x_stride, of y at y + r * y_stride elements; c[nb] the blocks, all full but the
 * last (nc_last channels). a<r><j>: row r, channels 8j .. 8j + 7 of the tile; unused ones fold
 * away. */
NPU_INLINE_VNNI void gemm_tile(const int mr, const int nb, size_t k, const int8_t *restrict x,
                               size_t x_stride, const struct npu_gemm_block *c, size_t nc_last,
                               __m256i yzp, int out16, uint8_t *restrict y, size_t y_stride) {
  const int8_t *x0 = x;
  const int8_t *x1 = mr > 1 ? x0 + x_stride : x0;
  const int8_t *x2 = mr > 2 ? x1 + x_stride : x1;
  const int8_t *x3 = mr > 3 ? x2 + x_stride : x2;
  const int8_t *x4 = mr > 4 ? x3 + x_stride : x3;
  const int8_t *x5 = mr > 5 ? x4 + x_stride : x4;
  const struct npu_gemm_block *c1 = nb > 1 ? &c[1] : &c[0];
  const __m256i i0 = c[0].init0, i1 = c[0].init1, i2 = c1->init0, i3 = c1->init1;
  __m256i a00 = i0, a01 = i1, a02 = i2, a03 = i3, a10 = i0, a11 = i1, a12 = i2, a13 = i3;
  __m256i a20 = i0, a21 = i1, a22 = i2, a23 = i3, a30 = i0, a31 = i1, a32 = i2, a33 = i3;
  __m256i a40 = i0, a41 = i1, a42 = i2, a43 = i3, a50 = i0, a51 = i1, a52 = i2, a53 = i3;
  const int8_t *wa = c[0].w, *wb = c1->w;
  /* One k group at weight offset 'off': XWORD(p) gives the 4 x bytes of the row at p. */
#define TILE_STEP(XWORD)                                                                           \
  do {                                                                                             \
    const __m256i w0 = _mm256_loadu_si256((const __m256i *)(wa + off));                            \
    const __m256i w1 = _mm256_loadu_si256((const __m256i *)(wa + off + 32));                       \
    const __m256i w2 = _mm256_loadu_si256((const __m256i *)(wb + off));                            \
    const __m256i w3 = _mm256_loadu_si256((const __m256i *)(wb + off + 32));                       \
    ROW_STEP(0, XWORD(x0));                                                                        \
    ROW_STEP(1, XWORD(x1));                                                                        \
    ROW_STEP(2, XWORD(x2));                                                                        \
    ROW_STEP(3, XWORD(x3));                                                                        \
    ROW_STEP(4, XWORD(x4));                                                                        \
    ROW_STEP(5, XWORD(x5));                                                                        \
  } while (0)
#define FULL_WORD(p) npu_gemm_load_word((p) + kk)
#define TAIL_WORD(p) npu_gemm_load_tail((p) + kk, k - kk)
  const size_t kfull = k / KR * KR;
  size_t kk = 0, off = 0;
  for (; kk < kfull; kk += KR, off += NR * KR) TILE_STEP(FULL_WORD);
  if (kk < k) TILE_STEP(TAIL_WORD);
#undef TILE_STEP
#undef FULL_WORD
#undef TAIL_WORD
  const size_t esize = out16 ? sizeof(int16_t) : sizeof(int8_t);
  ROW_STORE(0);
  ROW_STORE(1);
  ROW_STORE(2);
  ROW_STORE(3);
  ROW_STORE(4);
  ROW_STORE(5);
}

/* acc0, acc1 += the 4-byte x group 'xword' times the 64 weight bytes at 'wp' (16 channels). */
#define GEMV_GROUP(acc0, acc1, xword, wp)                                                          \
  do {                                                                                             \
    const __m256i xb_ = x_u8(xword);                                                               \
    acc0 = dpbusd(acc0, xb_, _mm256_loadu_si256((const __m256i *)(wp)));                           \
    acc1 = dpbusd(acc1, xb_, _mm256_loadu_si256((const __m256i *)((wp) + 32)));                    \
  } while (0)

/* Decode: one row x one block of 16 channels (c), its packed weights read front to back, so that
 * a thread's share of a matrix is one sequential stream. Four k groups at a time go to four pairs
 * of accumulators, added at the end (vpdpbusd's sums are modular, so the split changes no bit):
 * one pair would wait out vpdpbusd's latency on every group. */
NPU_INLINE_VNNI void gemv_block(size_t k, const int8_t *restrict x, const struct npu_gemm_block *c,
                                size_t nc, __m256i yzp, int out16, uint8_t *restrict y) {
  const __m256i zero = _mm256_setzero_si256();
  __m256i a0 = c->init0, a1 = c->init1, b0 = zero, b1 = zero;
  __m256i c0 = zero, c1 = zero, d0 = zero, d1 = zero;
  const int8_t *w = c->w;
  const size_t kfull = k / KR * KR;
  size_t kk = 0;
  for (; kk + 4 * KR <= kfull; kk += 4 * KR, w += 4 * NR * KR) {
    GEMV_GROUP(a0, a1, npu_gemm_load_word(x + kk), w);
    GEMV_GROUP(b0, b1, npu_gemm_load_word(x + kk + KR), w + NR * KR);
    GEMV_GROUP(c0, c1, npu_gemm_load_word(x + kk + 2 * KR), w + 2 * NR * KR);
    GEMV_GROUP(d0, d1, npu_gemm_load_word(x + kk + 3 * KR), w + 3 * NR * KR);
  }
  for (; kk < kfull; kk += KR, w += NR * KR) GEMV_GROUP(a0, a1, npu_gemm_load_word(x + kk), w);
  if (kk < k) GEMV_GROUP(a0, a1, npu_gemm_load_tail(x + kk, k - kk), w);
  a0 = _mm256_add_epi32(_mm256_add_epi32(a0, b0), _mm256_add_epi32(c0, d0));
  a1 = _mm256_add_epi32(_mm256_add_epi32(a1, b1), _mm256_add_epi32(c1, d1));
  npu_gemm_store_row(a0, a1, c, yzp, out16, y, nc);
}

/* gemm_tile() for a run-time row count 'mr' in [1, MR]. */
NPU_INLINE_VNNI void gemm_tile_rows(size_t mr, const int nb, size_t k, const int8_t *restrict x,
                                    size_t x_stride, const struct npu_gemm_block *c, size_t nc_last,
                                    __m256i yzp, int out16, uint8_t *restrict y, size_t y_stride) {
  switch (mr) {
  case 6: gemm_tile(6, nb, k, x, x_stride, c, nc_last, yzp, out16, y, y_stride); break;
  case 5: gemm_tile(5, nb, k, x, x_stride, c, nc_last, yzp, out16, y, y_stride); break;
  case 4: gemm_tile(4, nb, k, x, x_stride, c, nc_last, yzp, out16, y, y_stride); break;
  case 3: gemm_tile(3, nb, k, x, x_stride, c, nc_last, yzp, out16, y, y_stride); break;
  case 2: gemm_tile(2, nb, k, x, x_stride, c, nc_last, yzp, out16, y, y_stride); break;
  default: gemm_tile(1, nb, k, x, x_stride, c, nc_last, yzp, out16, y, y_stride); break;
  }
}

NPU_INLINE_VNNI void gemm_vnni(size_t m, size_t n_begin, size_t n_end, size_t k,
                               const int8_t *restrict x, size_t x_stride,
                               const void *restrict w_packed, void *restrict y, size_t y_stride,
                               const struct npu_qs8_gemm_params *restrict p, int out16) {
  const size_t block_size = npu_gemm_block_size(k, n_begin, p);
  if (m == 0) return;
  const size_t esize = out16 ? sizeof(int16_t) : sizeof(int8_t);
  const __m256i x_offset = _mm256_set1_epi32(p->x_zero_point + 128);
  const __m256i yzp = _mm256_set1_epi32(p->y_zero_point);
  const uint8_t *blocks = w_packed;
  uint8_t *yb = y;
  size_t n0 = n_begin;
  if (m == 1) {
    for (; n0 < n_end; n0 += NR) {
      const size_t nc = n_end - n0 < NR ? n_end - n0 : NR;
      struct npu_gemm_block c;
      npu_gemm_block_setup(blocks + n0 / NR * block_size, n0, nc, x_offset, p, &c);
      gemv_block(k, x, &c, nc, yzp, out16, yb + n0 * esize);
    }
    return;
  }
  while (n0 < n_end) {
    /* The next blocks: two, or the last one; all full but the last, which has nc_last
     * channels. */
    const size_t nb = n_end - n0 > NR ? 2 : 1;
    const size_t n1 = n0 + nb * NR < n_end ? n0 + nb * NR : n_end;
    const size_t nc_last = n1 - (n0 + (nb - 1) * NR);
    struct npu_gemm_block c[2];
    for (size_t b = 0; b < nb; b++)
      npu_gemm_block_setup(blocks + (n0 / NR + b) * block_size, n0 + b * NR,
                           b == nb - 1 ? nc_last : NR, x_offset, p, &c[b]);
    uint8_t *yn = yb + n0 * esize;
    n0 = n1;
    for (size_t i = 0; i < m; i += MR) {
      const size_t mr = m - i < MR ? m - i : MR;
      const int8_t *xi = x + i * x_stride;
      uint8_t *yi = yn + i * y_stride * esize;
      if (nb == 2) gemm_tile_rows(mr, 2, k, xi, x_stride, c, nc_last, yzp, out16, yi, y_stride);
      else gemm_tile_rows(mr, 1, k, xi, x_stride, c, nc_last, yzp, out16, yi, y_stride);
    }
  }
}

NPU_QS8_GEMM_X86_ENTRY(npu_qs8_gemm__avx512vnni, int8_t, NPU_TARGET_VNNI, gemm_vnni, 0)
NPU_QS8_GEMM_X86_ENTRY(npu_qs8_gemm_qs16__avx512vnni, int16_t, NPU_TARGET_VNNI, gemm_vnni, 1)

#endif /* __x86_64__ */
