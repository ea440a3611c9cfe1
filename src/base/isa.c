/* Which instruction-set extensions this CPU has (isa.h). */
#include "base/isa.h"

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
#endif
  return isa;
}
