/* Whole pages for a session's large buffers (KV cache, activation arenas, logits scratch), mapped
 * straight from the OS so that freeing a session gives its memory back at once. Through malloc it
 * may not: glibc raises its mmap threshold each time a large block is freed, after which blocks of
 * that size come from the heap and stay resident when freed, so a process that creates and frees
 * sessions (a server, npulm bench) would keep the largest one's memory for good. */
#ifndef NPU_BASE_PAGES_H
#define NPU_BASE_PAGES_H

#include <stddef.h>
#include <stdint.h>

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

/* 'size' bytes backed by a new file in directory 'dir' (removed at once, so that nothing is left
 * behind, whatever happens) whose disk space is taken at once (so that a full disk is this call
 * failing, not a store into the mapping faulting later), zero-filled and page-aligned; freed by
 * npu_pages_free(p, size). Its
 * pages given back with npu_pages_release go to that file, not away: room for data written once
 * and read once that need not stay in memory between (a streaming compile's packed weights, which
 * may be larger than memory). Where the system has no file mappings, plain pages. NULL on
 * failure, with errno saying why. */
void *npu_pages_map_scratch(const char *dir, size_t size);

/* Drop this process's copies of the whole pages inside [p, p + size) of a file mapping (a
 * read-only one, or npu_pages_map_scratch's, whose written pages go to its file): they stay in
 * the page cache and come back from the file if read again. After the data there was copied
 * elsewhere, or is not needed for a while, so that the process does not hold it. A no-op where
 * the system cannot. */
void npu_pages_release(const void *p, size_t size);

/* Bytes of memory the system can give without swapping (Linux: MemAvailable of /proc/meminfo), or
 * 0 where it does not say. */
uint64_t npu_mem_available(void);

#endif /* NPU_BASE_PAGES_H */
