/* Checking a GGUF file's checksums (see gguf_checksum.h; the writer's side is gguf_write.c). */
#include "io/gguf_checksum.h"

#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "base/common.h"
#include "base/pages.h"

#define CHECK_SLICE_BYTES (8u << 20)

static uint64_t padded(uint64_t n, uint32_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

npulm_status npu_gguf_checksums_find(const struct npu_gguf *g, const char *key,
                                     struct npu_gguf_arr *sums_out, npulm_error *err) {
  npulm_status st = npu_gguf_get_arr(g, key, NPU_GGUF_U64, sums_out, err);
  if (st != NPULM_OK) return st;
  if (sums_out->n != g->n_tensors + 1) {
    return npu_fail(err, NPULM_ERR_FORMAT, "'%s' holds %llu checksums for %llu tensors", key,
                    (unsigned long long)sums_out->n, (unsigned long long)g->n_tensors);
  }
  uint64_t at = 0; /* from the data offset; the reader checked that the tensors fit the file */
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    const struct npu_gguf_tensor *t = &g->tensors[i];
    if (t->offset != at) {
      const struct npu_gguf_str *prev = i > 0 ? &g->tensors[i - 1].name : NULL;
      return npu_fail(err, NPULM_ERR_FORMAT,
                      "tensor '%.*s' starts at data offset %llu, not where %s%.*s%s ends (%llu): "
                      "the checksums would not cover every byte",
                      (int)t->name.len, t->name.ptr, (unsigned long long)t->offset,
                      prev ? "tensor '" : "the header", prev ? (int)prev->len : 0,
                      prev ? prev->ptr : "", prev ? "'" : "", (unsigned long long)at);
    }
    at += padded(t->nbytes, g->alignment);
  }
  if (g->data_offset + at != g->size) {
    return npu_fail(err, NPULM_ERR_FORMAT,
                    "the file has %zu bytes but its header and tensors take %llu: it was cut "
                    "short or has bytes appended",
                    g->size, (unsigned long long)(g->data_offset + at));
  }
  return NPULM_OK;
}

void npu_gguf_region_bounds(const struct npu_gguf *g, uint64_t r, uint64_t *begin, uint64_t *end) {
  if (r == 0) {
    *begin = 0;
    *end = g->data_offset;
    return;
  }
  const struct npu_gguf_tensor *t = &g->tensors[r - 1];
  *begin = g->data_offset + t->offset;
  *end = *begin + padded(t->nbytes, g->alignment);
}

uint64_t npu_gguf_checksum_stored(const struct npu_gguf_arr *sums, uint64_t r) {
  uint64_t v;
  memcpy(&v, sums->data + 8 * r, sizeof(v)); /* little-endian, as the file (and the host) is */
  return v;
}

uint64_t npu_gguf_checksum_compute(const struct npu_gguf *g, const struct npu_gguf_arr *sums,
                                   uint64_t r) {
  uint64_t begin, end;
  npu_gguf_region_bounds(g, r, &begin, &end);
  if (r != 0) {
    /* in slices, each given back after it is read: a file is checked whole at load, and the
     * process need not keep the pages of weights it does not use (they stay in the page cache) */
    XXH3_state_t state;
    XXH3_64bits_reset(&state);
    for (uint64_t at = begin; at < end; at += CHECK_SLICE_BYTES) {
      const size_t k = (size_t)(end - at < CHECK_SLICE_BYTES ? end - at : CHECK_SLICE_BYTES);
      XXH3_64bits_update(&state, g->base + at, k);
      if (g->owns_mapping) npu_pages_release(g->base + at, k);
    }
    return XXH3_64bits_digest(&state);
  }
  /* the header, with the stored checksums read as the zeros they were when it was hashed */
  static const uint8_t zeros[4096];
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  const size_t at = (size_t)(sums->data - g->base);
  XXH3_64bits_update(&state, g->base, at);
  for (uint64_t left = sums->size; left > 0;) {
    size_t k = left < sizeof(zeros) ? (size_t)left : sizeof(zeros);
    XXH3_64bits_update(&state, zeros, k);
    left -= k;
  }
  XXH3_64bits_update(&state, sums->data + sums->size, (size_t)(end - at - sums->size));
  return XXH3_64bits_digest(&state);
}

npulm_status npu_gguf_checksums_reseal(uint8_t *image, size_t size, const char *key,
                                       npulm_error *err) {
  struct npu_gguf *g = NULL;
  struct npu_gguf_arr sums;
  npulm_status st = npu_gguf_open_memory(image, size, &g, err);
  if (st == NPULM_OK) st = npu_gguf_checksums_find(g, key, &sums, err);
  if (st == NPULM_OK) {
    uint8_t *stored = image + (sums.data - image);
    for (uint64_t r = 0; r < sums.n; r++) {
      uint64_t v = npu_gguf_checksum_compute(g, &sums, r);
      memcpy(stored + 8 * r, &v, sizeof(v));
    }
  }
  npu_gguf_close(g);
  return st;
}
