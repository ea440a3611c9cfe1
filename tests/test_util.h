/* Helpers for the cmocka tests: where the shared models and data are, reading a file, random
 * numbers, a clock. */
#ifndef NPU_TEST_UTIL_H
#define NPU_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "npulm.h"

/* Path of 'rel' under the shared data folder ($NPULM_SHARED, default ../shared). */
static inline const char *test_shared_path(const char *rel) {
  static char buf[4096];
  const char *root = getenv("NPULM_SHARED");
  snprintf(buf, sizeof(buf), "%s/%s", root != NULL ? root : "../shared", rel);
  return buf;
}

/* Skip the current test when a shared file is absent (a checkout without ../shared). */
#define TEST_REQUIRE_FILE(path)                                                                    \
  do {                                                                                             \
    if (access((path), R_OK) != 0) {                                                               \
      print_message("missing %s: skipped\n", (path));                                              \
      skip();                                                                                      \
    }                                                                                              \
  } while (0)

/* Open shared model 'rel' (skipping the test when it is absent; failing it on an error). */
static inline npulm_model *test_open_shared(const char *rel) {
  const char *path = test_shared_path(rel);
  TEST_REQUIRE_FILE(path);
  npulm_model *m = NULL;
  npulm_error err;
  npulm_status st = npulm_model_open(path, &m, &err);
  if (st != NPULM_OK) fail_msg("%s", err.msg);
  return m;
}

/* The whole of shared file 'rel' (malloc'd, NUL-terminated; '*len' bytes without the NUL),
 * skipping the test when it is absent. */
static inline char *test_slurp_shared(const char *rel, size_t *len) {
  const char *path = test_shared_path(rel);
  TEST_REQUIRE_FILE(path);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  buf[n] = '\0';
  *len = (size_t)n;
  return buf;
}

/* All of the (non-empty) file at 'path' in a malloc'd buffer of '*size' bytes. */
static inline uint8_t *test_read_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  assert_int_equal(fseek(f, 0, SEEK_END), 0);
  long n = ftell(f);
  assert_true(n > 0);
  rewind(f);
  uint8_t *buf = malloc((size_t)n);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *size = (size_t)n;
  return buf;
}

/* xorshift64*: deterministic random numbers for generated test cases. */
static inline uint64_t test_rand(uint64_t *state) {
  uint64_t x = *state;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *state = x;
  return x * 0x2545F4914F6CDD1DULL;
}

/* Seconds on the monotonic clock (for tests that wait a bounded time). */
static inline double test_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif /* NPU_TEST_UTIL_H */
