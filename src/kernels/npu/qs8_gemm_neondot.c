/* npu_qs8_gemm__neondot and npu_qs8_gemm_qs16__neondot: int8 GEMM with the Armv8.2 dot product
 * (sdot), in tiles of 4 rows x 16 channels (16 accumulators of the 32 vector registers); the tile
 * is npu_neon_gemm_tile_dot of qs8_gemm_neon.h. sdot multiplies signed by signed, so the raw int8
 * x enters and the zero point once per channel as bias - x_zero_point * wsum. Every int32 sum is
 * exact, so the result is bit-exact with npu_qs8_gemm__scalar. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__aarch64__) && NPU_NEON_DOTPROD_VARIANTS /* npu_ukernels.h */

#include "kernels/npu/qs8_gemm_neon.h"

NPU_QS8_GEMM_NEON_ENTRY(npu_qs8_gemm__neondot, int8_t, NPU_TARGET_DOTPROD, npu_neon_gemm_tile_dot,
                        4, 0, 0)
NPU_QS8_GEMM_NEON_ENTRY(npu_qs8_gemm_qs16__neondot, int16_t, NPU_TARGET_DOTPROD,
                        npu_neon_gemm_tile_dot, 4, 0, 1)

#endif /* __aarch64__ && NPU_NEON_DOTPROD_VARIANTS */
