/* The instruction-set extensions a kernel variant may need, and which of them this CPU has: one
 * detection for the NPU's integer microkernels (kernels/npu/npu_ukernels.inc) and the CPU's float
 * ones (kernels/cpu/cpu_ukernels.inc), each list naming the mask a variant needs. */
#ifndef NPU_BASE_ISA_H
#define NPU_BASE_ISA_H

#include <stdint.h>

/* Instruction-set extensions a variant needs (bit mask); 0 = plain C. */
enum npu_isa {
  NPU_ISA_AVX2 = 1u << 0,       /* x86-64 AVX2 + FMA */
  NPU_ISA_NEON = 1u << 1,       /* AArch64 Advanced SIMD (baseline on every AArch64 CPU) */
  NPU_ISA_AVX512VNNI = 1u << 2, /* x86-64 AVX512F/VL/BW + AVX512-VNNI (vpdpbusd on ymm) */
  NPU_ISA_DOTPROD = 1u << 3,    /* AArch64 dot product, sdot (Armv8.2-A FEAT_DotProd) */
  NPU_ISA_I8MM = 1u << 4,       /* AArch64 int8 matrix multiply, smmla (Armv8.6-A FEAT_I8MM) */
};

/* The NPU_ISA_* extensions this CPU has. */
uint32_t npu_isa_detect(void);

#endif /* NPU_BASE_ISA_H */
