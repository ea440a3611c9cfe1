/* Packing of int8 GEMM weights into the layout of the npu_qs8_gemm kernels (see npu_ukernels.h):
 * blocks of 16 channels, each with its bias, its weight sums and its weights in 4-byte k groups. */
#include <string.h>

#include "kernels/npu/npu_ukernels.h"

static size_t gemm_kp(size_t k) {
  return (k + NPU_QS8_GEMM_KR - 1) / NPU_QS8_GEMM_KR * NPU_QS8_GEMM_KR;
}

size_t npu_qs8_gemm_packed_size(size_t n, size_t k) {
  const size_t nr = NPU_QS8_GEMM_NR;
  const size_t blocks = (n + nr - 1) / nr;
  return blocks * (2 * nr * sizeof(int32_t) + nr * gemm_kp(k));
}

bool npu_qs8_gemm_pack(size_t n, size_t k, const int8_t *restrict w, const int32_t *restrict bias,
                       void *restrict packed_out) {
  enum { NR = NPU_QS8_GEMM_NR, KR = NPU_QS8_GEMM_KR };
  if (k == 0 || k > NPU_QS8_GEMM_MAX_K) return false;
  const size_t kp = gemm_kp(k);
  uint8_t *block = packed_out;
  for (size_t n0 = 0; n0 < n; n0 += NR) {
    int32_t head[2 * NR] = {0}; /* bias[NR], wsum[NR] */
    int8_t *wq = (int8_t *)(block + sizeof(head));
    memset(wq, 0, NR * kp);
    for (size_t j = 0; j < NR && n0 + j < n; j++) {
      const int8_t *row = w + (n0 + j) * k;
      int32_t sum = 0;
      for (size_t kk = 0; kk < k; kk++) {
        if (row[kk] == INT8_MIN) return false;
        sum += row[kk];
        wq[(kk / KR) * NR * KR + j * KR + kk % KR] = row[kk];
      }
      const int32_t b = bias != NULL ? bias[n0 + j] : 0;
      if (b > (1 << 30) || b < -(1 << 30)) return false;
      head[j] = b;
      head[NR + j] = sum;
    }
    memcpy(block, head, sizeof(head));
    block += sizeof(head) + NR * kp;
  }
  return true;
}

void npu_qs8_gemm_unpack_row(size_t k, const void *restrict packed, size_t r, size_t c0, size_t c1,
                             int8_t *restrict out) {
  enum { NR = NPU_QS8_GEMM_NR, KR = NPU_QS8_GEMM_KR };
  const size_t block_size = 2 * NR * sizeof(int32_t) + NR * gemm_kp(k);
  const int8_t *wq = (const int8_t *)packed + (r / NR) * block_size + 2 * NR * sizeof(int32_t);
  const size_t j = r % NR;
  for (size_t c = c0; c < c1; c++) out[c - c0] = wq[(c / KR) * NR * KR + j * KR + c % KR];
}

int32_t npu_qs8_gemm_bias(size_t k, const void *restrict packed, size_t r) {
  enum { NR = NPU_QS8_GEMM_NR };
  const size_t block_size = 2 * NR * sizeof(int32_t) + NR * gemm_kp(k);
  int32_t bias;
  memcpy(&bias, (const uint8_t *)packed + (r / NR) * block_size + (r % NR) * sizeof(int32_t),
         sizeof(bias));
  return bias;
}
