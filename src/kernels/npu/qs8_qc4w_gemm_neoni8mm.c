/* npu_qs8_qc4w_gemm__neoni8mm and npu_qs8_qc4w_gemm_qs16__neoni8mm: the w4a8 GEMM with the int8
 * matrix multiply (smmla): each qc4w nibble pair is decoded into the two int8 groups it holds and
 * goes through the int8 kernel's smmla tile (npu_neon_gemm_tile_mmla, 4 rows x 16 channels; one
 * row takes the sdot tile). Bit-exact with npu_qs8_qc4w_gemm__scalar: the same exact int32 sums. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__aarch64__) && NPU_NEON_I8MM_VARIANTS /* npu_ukernels.h */

#include "kernels/npu/qs8_gemm_neon.h"

NPU_QS8_GEMM_NEON_ENTRY(npu_qs8_qc4w_gemm__neoni8mm, int8_t, NPU_TARGET_I8MM,
                        npu_neon_gemm_tile_mmla, 4, 1, 0)
NPU_QS8_GEMM_NEON_ENTRY(npu_qs8_qc4w_gemm_qs16__neoni8mm, int16_t, NPU_TARGET_I8MM,
                        npu_neon_gemm_tile_mmla, 4, 1, 1)

#endif /* __aarch64__ && NPU_NEON_I8MM_VARIANTS */
