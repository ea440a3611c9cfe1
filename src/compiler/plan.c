/* The memory planner: every activation gets a fixed offset in its backend's arena. Tensors whose
 * lifetimes (from the node that writes them to the last node that reads them) do not overlap may
 * share bytes. Placement is greedy: largest first, each at the lowest offset free for its whole
 * lifetime — the usual offline strategy of TFLite's and XNNPACK's planners. */
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "compiler/compiler.h"

#define ARENA_ALIGN 64 /* cache line; also what SIMD kernels want */

struct live {
  int32_t id;
  int32_t first, last; /* node indices */
  uint64_t size;
  uint64_t offset;
};

static int by_size_desc(const void *a, const void *b) {
  const struct live *x = a, *y = b;
  if (x->size != y->size) return x->size < y->size ? 1 : -1;
  return x->first - y->first;
}

static int by_offset(const void *a, const void *b) {
  const struct live *x = *(const struct live *const *)a, *y = *(const struct live *const *)b;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Place 'n' tensors; returns the arena size. 'scratch' holds n pointers. */
static uint64_t place(struct live *l, int32_t n, const struct live **scratch) {
  qsort(l, (size_t)n, sizeof(*l), by_size_desc);
  uint64_t arena = 0;
  for (int32_t i = 0; i < n; i++) {
    /* the already placed tensors alive at the same time, by offset */
    int32_t m = 0;
    for (int32_t j = 0; j < i; j++) {
      if (l[j].first <= l[i].last && l[i].first <= l[j].last) scratch[m++] = &l[j];
    }
    qsort(scratch, (size_t)m, sizeof(*scratch), by_offset);
    uint64_t offset = 0;
    for (int32_t j = 0; j < m; j++) {
      if (scratch[j]->offset >= offset + l[i].size) break; /* fits in the gap before it */
      uint64_t end = scratch[j]->offset + scratch[j]->size;
      if (end > offset) offset = end;
    }
    l[i].offset = offset;
    if (offset + l[i].size > arena) arena = offset + l[i].size;
  }
  return arena;
}

npulm_status npu_plan(struct npu_graph *g, npulm_error *err) {
  struct live *live = malloc((size_t)(g->n_tensors > 0 ? g->n_tensors : 1) * sizeof(*live));
  int32_t *index = malloc((size_t)(g->n_tensors > 0 ? g->n_tensors : 1) * sizeof(*index));
  const struct live **scratch =
      malloc((size_t)(g->n_tensors > 0 ? g->n_tensors : 1) * sizeof(*scratch));
  if (live == NULL || index == NULL || scratch == NULL) {
    free(live);
    free(index);
    free(scratch);
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory planning a graph");
  }
  for (int be = 0; be < NPU_BE_COUNT; be++) {
    int32_t n = 0;
    for (int32_t t = 0; t < g->n_tensors; t++) {
      index[t] = -1;
      const struct npu_ir_tensor *tensor = &g->tensors[t];
      if (tensor->kind != NPU_TK_ACT || tensor->backend != be) continue;
      uint64_t size =
          (npu_ir_tensor_bytes(tensor) + ARENA_ALIGN - 1) & ~(uint64_t)(ARENA_ALIGN - 1);
      index[t] = n;
      live[n++] = (struct live){.id = t, .first = -1, .last = -1, .size = size};
    }
    for (int32_t i = 0; i < g->n_nodes; i++) {
      const struct npu_ir_node *node = &g->nodes[i];
      if (index[node->out] >= 0 && live[index[node->out]].first < 0) {
        live[index[node->out]].first = live[index[node->out]].last = i;
      }
      for (int s = 0; s < NPU_IR_MAX_IN; s++) {
        if (node->in[s] >= 0 && index[node->in[s]] >= 0) live[index[node->in[s]]].last = i;
      }
    }
    g->arena_size[be] = place(live, n, scratch);
    for (int32_t i = 0; i < n; i++) g->tensors[live[i].id].offset = live[i].offset;
  }
  free(live);
  free(index);
  free(scratch);
  return NPULM_OK;
}
