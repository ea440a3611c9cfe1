/* Helpers every module shares: error reporting and overflow-checked size arithmetic. */
#ifndef NPU_BASE_COMMON_H
#define NPU_BASE_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "npulm.h"

#if defined(__GNUC__)
#define NPU_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define NPU_PRINTF(fmt, args)
#endif

/* Write a one-line message into 'err' (may be NULL) and return 'status', so that failure paths
 * read: return npu_fail(err, NPULM_ERR_FORMAT, "tensor '%s' ...", name); */
npulm_status npu_fail(npulm_error *err, npulm_status status, const char *fmt, ...) NPU_PRINTF(3, 4);

/* Overflow-checked arithmetic: return false (and leave '*out' unspecified) on overflow. */
static inline bool npu_add_u64(uint64_t a, uint64_t b, uint64_t *out) {
  return !__builtin_add_overflow(a, b, out);
}
static inline bool npu_mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
  return !__builtin_mul_overflow(a, b, out);
}

/* Monotonic clock in seconds. */
double npu_now(void);

#endif /* NPU_BASE_COMMON_H */
