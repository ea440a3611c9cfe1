/* Whole-page allocations: npu_pages_alloc_huge gives zeroed, writable memory of every size, on a
 * huge-page boundary where the system advises huge pages, freed exactly; npu_pages_release drops
 * a file mapping's pages without changing what reads back. */
#define _DEFAULT_SOURCE /* MADV_HUGEPAGE, as src/base/pages.c sees it */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/pages.h"
#include "test_util.h"

static void test_alloc_huge(void **state) {
  (void)state;
  const size_t mib = 1u << 20;
  const size_t sizes[] = {1, 4095, 4096, 2 * mib - 1, 2 * mib, 2 * mib + 1, 5 * mib + 3};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    const size_t n = sizes[i];
    uint8_t *p = npu_pages_alloc_huge(n);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 4096, 0);
#if defined(MADV_HUGEPAGE)
    if (n >= 2 * mib) assert_int_equal((uintptr_t)p % (2 * mib), 0);
#endif
    for (size_t j = 0; j < n; j += 997) assert_int_equal(p[j], 0);
    assert_int_equal(p[n - 1], 0);
    memset(p, 0xa5, n);
    npu_pages_free(p, n);
  }
  npu_pages_free(NULL, 0);
}

static void test_release_keeps_contents(void **state) {
  (void)state;
  char path[] = "/tmp/npulm-test-pages-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  const size_t n = 5 * 4096 + 123;
  uint8_t *want = malloc(n);
  assert_non_null(want);
  uint64_t rng = 7;
  for (size_t i = 0; i < n; i++) want[i] = (uint8_t)test_rand(&rng);
  assert_int_equal(write(fd, want, n), (ssize_t)n);
  uint8_t *map = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
  assert_true(map != MAP_FAILED);
  assert_memory_equal(map, want, n);
  /* a range that starts and ends inside pages, one inside a single page, the whole file */
  npu_pages_release(map + 100, n - 300);
  assert_memory_equal(map, want, n);
  npu_pages_release(map + 10, 20);
  assert_memory_equal(map, want, n);
  npu_pages_release(map, n);
  assert_memory_equal(map, want, n);
  munmap(map, n);
  close(fd);
  unlink(path);
  free(want);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_alloc_huge),
      cmocka_unit_test(test_release_keeps_contents),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
