/* Whole pages for a session's large buffers (KV cache, activation arenas, logits scratch), mapped
 * straight from the OS so that freeing a session gives its memory back at once. Through malloc it
 * may not: glibc raises its mmap threshold each time a large block is freed, after which blocks of
 * that size come from the heap and stay resident when freed, so a process that creates and frees
 * sessions (a server, npulm bench) would keep the largest one's memory for good. */
#ifndef NPU_BASE_PAGES_H
#define NPU_BASE_PAGES_H

#include <stddef.h>

/* 'size' bytes (at least one page), zero-filled and page-aligned; NULL if out of memory. */
void *npu_pages_alloc(size_t size);

/* npu_pages_alloc for memory streamed end to end on every token (the NPU's packed weights),
 * advised for transparent huge pages where the system has them (Linux MADV_HUGEPAGE; the block
 * starts on a 2 MiB boundary so that whole huge pages fit). With 4 KiB pages each page costs a
 * TLB walk and the hardware prefetcher stops at its end: both threads streaming 110 MB of
 * stories110M's decode matmuls ran 7-10 % faster from huge pages in this host's fast bandwidth
 * state (bench/HISTORY.md). Freed by npu_pages_free(p, size). */
void *npu_pages_alloc_huge(size_t size);

/* Give back what npu_pages_alloc(size) or npu_pages_alloc_huge(size) returned; accepts NULL. */
void npu_pages_free(void *p, size_t size);

/* Drop this process's copies of the whole pages inside [p, p + size) of a read-only file mapping
 * (they stay in the page cache, and come back from the file if read again): after the data there
 * was copied elsewhere, so that the process does not hold it twice. A no-op where the system
 * cannot. */
void npu_pages_release(const void *p, size_t size);

#endif /* NPU_BASE_PAGES_H */
