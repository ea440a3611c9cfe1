/* Which instruction-set extensions this CPU has (isa.h). */
#include "base/isa.h"

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h> /* getauxval: the kernel's hardware capability bits */
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1ul << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1ul << 13)
#endif
#endif

uint32_t npu_isa_detect(void) {
  uint32_t isa = 0;
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) isa |= NPU_ISA_AVX2;
  if ((isa & NPU_ISA_AVX2) && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vnni"))
    isa |= NPU_ISA_AVX512VNNI;
#elif defined(__aarch64__)
  isa |= NPU_ISA_NEON;
#if defined(__linux__)
  if (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) isa |= NPU_ISA_DOTPROD;
  if (getauxval(AT_HWCAP2) & HWCAP2_I8MM) isa |= NPU_ISA_I8MM;
#endif
#endif
  return isa;
}
