/* Packing of int4 GEMM weights into the qc4w layout of npu_ukernels.h: blocks of 16 channels, each
 * with its bias, its (block-scaled) weight sums and its weights as nibble pairs of 8 k, preceded
 * per 32-k chunk by the chunk's 16 block scales when block == 32. */
#include <string.h>

#include "kernels/npu/npu_ukernels.h"

enum { NR = NPU_QS8_GEMM_NR, PAIR = 64 /* bytes of a nibble pair: 16 channels x 8 k */ };

size_t npu_qc4w_gemm_packed_size(size_t n, size_t k, size_t block) {
  return (n + NR - 1) / NR * npu_qc4w_gemm_block_size(k, block);
}

/* Byte offset, within a 16-channel block's weight area (after the 128-byte head), of the nibble
 * pair that holds k index 'kk', or with scale = 1 of the chunk's scales. */
static size_t pair_offset(size_t kk, size_t block) {
  if (block == 0) return kk / 8 * PAIR;
  return kk / NPU_QC4W_BLOCK * (NR + 4 * PAIR) + NR + kk % NPU_QC4W_BLOCK / 8 * PAIR;
}

/* Byte of channel j, k index kk within its pair, and whether it is the high nibble. */
static size_t nibble_byte(size_t j, size_t kk, size_t block, int *high) {
  *high = kk % 8 >= 4;
  return pair_offset(kk, block) + j * 4 + kk % 4;
}

bool npu_qc4w_gemm_pack(size_t n, size_t k, const int8_t *restrict w, const int32_t *restrict bias,
                        size_t block, const uint8_t *restrict bscale, void *restrict packed_out) {
  if (k == 0 || k > NPU_QS8_GEMM_MAX_K) return false;
  if (block != 0 && block != NPU_QC4W_BLOCK) return false;
  if ((block == 0) != (bscale == NULL)) return false;
  const size_t kp = npu_qc4w_gemm_kp(k, block), bsize = npu_qc4w_gemm_block_size(k, block);
  const size_t nb = (k + NPU_QC4W_BLOCK - 1) / NPU_QC4W_BLOCK; /* scales per row */
  uint8_t *blk = packed_out;
  for (size_t n0 = 0; n0 < n; n0 += NR, blk += bsize) {
    int32_t head[2 * NR] = {0}; /* bias[NR], wsum[NR] */
    uint8_t *wq = blk + sizeof(head);
    memset(wq, 0x88, bsize - sizeof(head)); /* weight 0 in both nibbles */
    if (block != 0)
      for (size_t c = 0; c < kp / NPU_QC4W_BLOCK; c++)
        memset(wq + pair_offset(c * 32, block) - NR, 0, NR);
    for (size_t j = 0; j < NR && n0 + j < n; j++) {
      const int8_t *row = w + (n0 + j) * k;
      int32_t sum = 0;
      for (size_t kk = 0; kk < k; kk++) {
        if (row[kk] < -8 || row[kk] > 7) return false;
        int32_t q = 1;
        if (block != 0) {
          q = bscale[(n0 + j) * nb + kk / NPU_QC4W_BLOCK];
          if (q > 15) return false;
          if (kk % NPU_QC4W_BLOCK == 0) wq[pair_offset(kk, block) - NR + j] = (uint8_t)q;
        }
        sum += q * row[kk];
        int high;
        uint8_t *b = wq + nibble_byte(j, kk, block, &high);
        const uint8_t v = (uint8_t)(row[kk] + 8);
        *b = high ? (uint8_t)((*b & 0x0F) | v << 4) : (uint8_t)((*b & 0xF0) | v);
      }
      const int32_t b = bias != NULL ? bias[n0 + j] : 0;
      if (b > (1 << 30) || b < -(1 << 30)) return false;
      head[j] = b;
      head[NR + j] = sum;
    }
    memcpy(blk, head, sizeof(head));
  }
  return true;
}

void npu_qc4w_gemm_unpack_row(size_t k, size_t block, const void *restrict packed, size_t r,
                              size_t c0, size_t c1, int8_t *restrict out) {
  const uint8_t *wq = (const uint8_t *)packed + r / NR * npu_qc4w_gemm_block_size(k, block) +
                      2 * NR * sizeof(int32_t);
  for (size_t c = c0; c < c1; c++) {
    int high;
    const uint8_t b = wq[nibble_byte(r % NR, c, block, &high)];
    out[c - c0] = (int8_t)((high ? b >> 4 : b & 0x0F) - 8);
  }
}

void npu_qc4w_gemm_unpack_scales(size_t k, const void *restrict packed, size_t r,
                                 uint8_t *restrict out) {
  const uint8_t *wq = (const uint8_t *)packed +
                      r / NR * npu_qc4w_gemm_block_size(k, NPU_QC4W_BLOCK) +
                      2 * NR * sizeof(int32_t);
  for (size_t b = 0; b < (k + NPU_QC4W_BLOCK - 1) / NPU_QC4W_BLOCK; b++) {
    out[b] = wq[pair_offset(b * NPU_QC4W_BLOCK, NPU_QC4W_BLOCK) - NR + r % NR];
  }
}

int32_t npu_qc4w_gemm_bias(size_t k, size_t block, const void *restrict packed, size_t r) {
  int32_t bias;
  memcpy(&bias,
         (const uint8_t *)packed + r / NR * npu_qc4w_gemm_block_size(k, block) +
             r % NR * sizeof(int32_t),
         sizeof(bias));
  return bias;
}
