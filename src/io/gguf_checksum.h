/* The checksums of a GGUF file that npu_gguf_writer_add_checksums wrote: XXH3-64 of the header
 * (its own stored values read as zero) and of each tensor's data with its padding, so that every
 * byte of the file is covered and each piece can be checked on its own before it is first used.
 *
 * Why XXH3-64: the checks guard against damage (bit rot, a torn copy, a bad download), not against
 * an attacker, so a non-cryptographic hash will do; XXH3 is well known, specified and stable
 * since xxHash 0.8, reads memory faster than a loaded page arrives from disk (tens of GB/s with
 * SSE2/AVX2/NEON), is packaged by Debian (libxxhash), and its 64 bits make an undetected random
 * change a 2^-64 event per piece, where CRC-32's 2^-32 would be thin over a file of gigabytes. */
#ifndef NPU_IO_GGUF_CHECKSUM_H
#define NPU_IO_GGUF_CHECKSUM_H

#include <stdint.h>

#include "io/gguf.h"
#include "npulm.h"

#define NPU_GGUF_CHECKSUM_NAME "XXH3-64"

/* The checksums stored under 'key'. An error naming the problem unless the key holds a U64 array
 * of n_tensors + 1 values and the tensors lie back to back in declaration order, each padded to
 * the alignment, from the data offset to the very end of the file (so that the regions below
 * cover every byte). */
npulm_status npu_gguf_checksums_find(const struct npu_gguf *g, const char *key,
                                     struct npu_gguf_arr *sums_out, npulm_error *err);

/* Region r of a file whose checksums were found: 0 the header, bytes [0, data offset); 1 + i
 * tensor i's data and padding. Its bytes [*begin, *end). */
void npu_gguf_region_bounds(const struct npu_gguf *g, uint64_t r, uint64_t *begin, uint64_t *end);
/* The checksum stored for region r, and the one its bytes have now. */
uint64_t npu_gguf_checksum_stored(const struct npu_gguf_arr *sums, uint64_t r);
uint64_t npu_gguf_checksum_compute(const struct npu_gguf *g, const struct npu_gguf_arr *sums,
                                   uint64_t r);

/* Recompute and store every checksum of a GGUF image in memory, for tests and fuzzers that edit
 * a file on purpose and want its other checks to see the edit. */
npulm_status npu_gguf_checksums_reseal(uint8_t *image, size_t size, const char *key,
                                       npulm_error *err);

#endif /* NPU_IO_GGUF_CHECKSUM_H */
