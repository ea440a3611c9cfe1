/* npu_pages_alloc / npu_pages_free (see pages.h): anonymous mmap where the system has it, else
 * the C library's aligned allocation. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS: not in POSIX 2008, but in every Unix this targets */
#include "runtime/pages.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#if defined(MAP_ANONYMOUS)

void *npu_pages_alloc(size_t size) {
  void *p = mmap(NULL, size > 0 ? size : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

void npu_pages_free(void *p, size_t size) {
  if (p != NULL) munmap(p, size > 0 ? size : 1);
}

#else

enum { PAGE = 4096 };

void *npu_pages_alloc(size_t size) {
  size_t rounded = (size + PAGE - 1) / PAGE * PAGE;
  if (rounded < size) return NULL;
  void *p = aligned_alloc(PAGE, rounded > 0 ? rounded : PAGE);
  if (p != NULL) memset(p, 0, rounded);
  return p;
}

void npu_pages_free(void *p, size_t size) {
  (void)size;
  free(p);
}

#endif
