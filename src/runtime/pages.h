/* Whole pages for a session's large buffers (KV cache, activation arenas, logits scratch), mapped
 * straight from the OS so that freeing a session gives its memory back at once. Through malloc it
 * may not: glibc raises its mmap threshold each time a large block is freed, after which blocks of
 * that size come from the heap and stay resident when freed, so a process that creates and frees
 * sessions (a server, npulm bench) would keep the largest one's memory for good. */
#ifndef NPU_RUNTIME_PAGES_H
#define NPU_RUNTIME_PAGES_H

#include <stddef.h>

/* 'size' bytes (at least one page), zero-filled and page-aligned; NULL if out of memory. */
void *npu_pages_alloc(size_t size);

/* Give back what npu_pages_alloc(size) returned; accepts NULL. */
void npu_pages_free(void *p, size_t size);

#endif /* NPU_RUNTIME_PAGES_H */
