/* npu_pages_alloc, npu_pages_alloc_huge, npu_pages_free, npu_pages_release (see pages.h):
 * anonymous mmap where the system has it, else the C library's aligned allocation. */
/* MAP_ANONYMOUS, madvise: not in POSIX 2008, but in every Unix this targets */
#define _DEFAULT_SOURCE
#include "base/pages.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(MAP_ANONYMOUS)

void *npu_pages_alloc(size_t size) {
  void *p =
      mmap(NULL, size > 0 ? size : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

void npu_pages_free(void *p, size_t size) {
  if (p != NULL) munmap(p, size > 0 ? size : 1);
}

#if defined(MADV_HUGEPAGE)

enum { HUGE = 2 << 20 };

void *npu_pages_alloc_huge(size_t size) {
  if (size < HUGE) return npu_pages_alloc(size);
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  const size_t span = (size + page - 1) / page * page;
  if (span < size || span > SIZE_MAX - HUGE) return NULL;
  /* map a huge page more than asked, then unmap what lies outside the aligned block, so that
   * npu_pages_free(p, size) frees exactly the mapping */
  uint8_t *raw =
      mmap(NULL, span + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return NULL;
  uint8_t *p = (uint8_t *)(((uintptr_t)raw + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
  if (p > raw) munmap(raw, (size_t)(p - raw));
  if (raw + span + HUGE > p + span) munmap(p + span, (size_t)(raw + span + HUGE - (p + span)));
  (void)madvise(p, span, MADV_HUGEPAGE); /* advice: without it the pages are just small */
  return p;
}

#else

void *npu_pages_alloc_huge(size_t size) { return npu_pages_alloc(size); }

#endif

void *npu_pages_map_scratch(const char *dir, size_t size) {
  char path[4096];
  if (snprintf(path, sizeof(path), "%s/.npulm-scratch-XXXXXX", dir) >= (int)sizeof(path)) {
    return NULL;
  }
  int fd = mkstemp(path);
  if (fd < 0) return NULL;
  (void)unlink(path);
  void *p = MAP_FAILED;
  /* the room is taken now: a store into a mapped page the disk has no room for would be SIGBUS */
  int fail = posix_fallocate(fd, 0, (off_t)(size > 0 ? size : 1));
  if (fail == 0) p = mmap(NULL, size > 0 ? size : 1, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  else errno = fail;
  fail = errno;
  close(fd);
  errno = fail;
  return p == MAP_FAILED ? NULL : p;
}

void npu_pages_release(const void *p, size_t size) {
#if defined(MADV_DONTNEED)
  const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  const uintptr_t begin = ((uintptr_t)p + page - 1) & ~(page - 1);
  const uintptr_t end = ((uintptr_t)p + size) & ~(page - 1);
  if (end > begin) (void)madvise((void *)begin, (size_t)(end - begin), MADV_DONTNEED);
#else
  (void)p;
  (void)size;
#endif
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

void *npu_pages_alloc_huge(size_t size) { return npu_pages_alloc(size); }

void *npu_pages_map_scratch(const char *dir, size_t size) {
  (void)dir;
  return npu_pages_alloc(size);
}

void npu_pages_free(void *p, size_t size) {
  (void)size;
  free(p);
}

void npu_pages_release(const void *p, size_t size) {
  (void)p;
  (void)size;
}

#endif

uint64_t npu_mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (f == NULL) return 0;
  char line[128];
  unsigned long long kib = 0;
  while (fgets(line, sizeof(line), f) != NULL) {
    if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
  }
  fclose(f);
  return (uint64_t)kib * 1024u;
}
