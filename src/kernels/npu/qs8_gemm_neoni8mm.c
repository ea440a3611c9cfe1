/* npu_qs8_gemm__neoni8mm and npu_qs8_gemm_qs16__neoni8mm: int8 GEMM with the Armv8.6 int8 matrix
 * multiply (smmla), in tiles of 4 rows (two pairs) x 16 channels; a single row takes the sdot tile.
 * npu_neon_gemm_tile_mmla of qs8_gemm_neon.h. Every int32 sum is exact, so the result is bit-exact
 * with npu_qs8_gemm__scalar. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__aarch64__) && NPU_NEON_I8MM_VARIANTS /* npu_ukernels.h */

#include "kernels/npu/qs8_gemm_neon.h"

NPU_QS8_GEMM_NEON_ENTRY(npu_qs8_gemm__neoni8mm, int8_t, NPU_TARGET_I8MM, npu_neon_gemm_tile_mmla, 4,
                        0, 0)
NPU_QS8_GEMM_NEON_ENTRY(npu_qs8_gemm_qs16__neoni8mm, int16_t, NPU_TARGET_I8MM,
                        npu_neon_gemm_tile_mmla, 4, 0, 1)

#endif /* __aarch64__ && NPU_NEON_I8MM_VARIANTS */
