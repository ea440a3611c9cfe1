/* AVX512-VNNI building blocks shared by the __avx512vnni NPU kernels: the target attribute (VNNI
 * on 256-bit registers through AVX512VL, so 32 of them) and vpdpbusd. Callers check
 * NPU_ISA_AVX512VNNI (which implies AVX512F/VL/BW) and NPU_ISA_AVX2 first (npu_ukernels.c). */
#ifndef NPU_KERNELS_NPU_VNNI_UTIL_H
#define NPU_KERNELS_NPU_VNNI_UTIL_H

#if defined(__x86_64__)

#include <immintrin.h>

#define NPU_VNNI_ISA "avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni"
#define NPU_TARGET_VNNI __attribute__((target(NPU_VNNI_ISA)))
#define NPU_INLINE_VNNI static inline __attribute__((always_inline, target(NPU_VNNI_ISA)))

/* acc += per lane the 4 products u8 x s8 of a 4-byte group (vpdpbusd, modular). For GCC inline
 * assembly: with the intrinsic GCC 12 keeps a copy of each accumulator and spills a 6 x 32
 * tile's 24 to the stack every k group; pinned in place, they stay in registers, and s8 still
 * comes straight from memory where it is used once. Clang allocates the intrinsic well, but turns
 * the "vm" operand into a stack copy. */
NPU_INLINE_VNNI __m256i npu_vnni_dpbusd(__m256i acc, __m256i u8, __m256i s8) {
#if defined(__clang__)
  return _mm256_dpbusd_epi32(acc, u8, s8);
#else
  __asm__("vpdpbusd {%2, %1, %0|%0, %1, %2}" : "+v"(acc) : "v"(u8), "vm"(s8));
  return acc;
#endif
}

#endif /* __x86_64__ */
#endif /* NPU_KERNELS_NPU_VNNI_UTIL_H */
