/* The sparse decode data's sizes, placement, lookups and ownership (see sparse_data.h). */
#include "program/sparse_data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/pages.h"

npulm_status npu_sparse_sites_of(const struct npu_program *p, int32_t layer,
                                 struct npu_sparse_sites *out, npulm_error *err) {
  static const char *const roles[5] = {"ffn_gate", "ffn_up", "ffn_silu", "ffn_gate_par",
                                       "ffn_down"};
  const struct npu_qsite *s[5];
  for (int i = 0; i < 5; i++) {
    char name[NPU_IR_NAME_MAX];
    snprintf(name, sizeof(name), "blk.%d.%s", layer, roles[i]);
    s[i] = npu_program_qsite(p, name);
    const bool matmul = i == 0 || i == 1 || i == 4;
    if (s[i] == NULL || (matmul && (s[i]->w_bits != 8 || s[i]->n_outliers > 0)) ||
        (i == 2 && s[i]->lut_wide)) {
      return npu_fail(err, NPULM_ERR_UNSUPPORTED,
                      "sparse decode needs the FFN of layer %d in int8 weights and activations "
                      "without shadow outliers (w8a8-naive or w8a8-smooth); '%s' is not",
                      layer, name);
    }
  }
  const struct npu_qtensor *gq = npu_program_qtensor(p, s[0]->name);
  const struct npu_qtensor *xq = npu_program_qtensor(p, s[4]->name);
  if (gq == NULL || xq == NULL || gq->dtype != NPU_DT_I8 || !(gq->q.scale > 0.0f)) {
    return npu_fail(err, NPULM_ERR_UNSUPPORTED,
                    "sparse decode needs layer %d's FFN gate quantized to int8", layer);
  }
  *out = (struct npu_sparse_sites){s[0], s[1], s[2], s[3], s[4], gq->q.scale};
  return NPULM_OK;
}

uint64_t npu_sparse_bundle_bytes(const struct npu_sparse *s, int32_t layer) {
  return (uint64_t)s->layers[layer].n_ff * 3 * (uint64_t)s->kp;
}

static int cmp_u64(const void *a, const void *b) {
  const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

bool npu_sparse_places(const uint32_t *freq, int32_t n_ff, int32_t *place) {
  /* each neuron's key: its count inverted (most kept first) above its index */
  uint64_t *key = malloc((size_t)n_ff * sizeof(uint64_t));
  if (key == NULL) return false;
  for (int32_t j = 0; j < n_ff; j++) key[j] = (uint64_t)(UINT32_MAX - freq[j]) << 32 | (uint32_t)j;
  qsort(key, (size_t)n_ff, sizeof(uint64_t), cmp_u64);
  for (int32_t p = 0; p < n_ff; p++) place[(uint32_t)key[p]] = p;
  free(key);
  return true;
}

uint64_t npu_sparse_predictor_bytes(const struct npu_sparse *s, int32_t layer) {
  const struct npu_sparse_layer *l = &s->layers[layer];
  if (l->rank == 0) return 0;
  return npu_qs8_gemm_packed_size((size_t)l->rank, (size_t)s->dim) +
         npu_qs8_gemm_packed_size((size_t)l->n_ff, (size_t)l->rank) +
         2 * sizeof(int32_t) * (uint64_t)(l->rank + l->n_ff);
}

/* A layer's arrays that npu_sparse_place moves: bundles, the predictor's two packed matrices. */
static void placed_arrays(const struct npu_sparse *s, int32_t l, void ***ptr, size_t *size) {
  struct npu_sparse_layer *ly = &s->layers[l];
  ptr[0] = (void **)&ly->bundles;
  ptr[1] = &ly->pred_b;
  ptr[2] = &ly->pred_a;
  size[0] = (size_t)npu_sparse_bundle_bytes(s, l);
  const bool pred = ly->rank > 0;
  size[1] = pred ? npu_qs8_gemm_packed_size((size_t)ly->rank, (size_t)s->dim) : 0;
  size[2] = pred ? npu_qs8_gemm_packed_size((size_t)ly->n_ff, (size_t)ly->rank) : 0;
}

npulm_status npu_sparse_place(struct npu_sparse *s, bool bundles, npulm_error *err) {
  enum { ALIGN = 64 };
  if (s->arena != NULL) return NPULM_OK;
  const int first = bundles ? 0 : 1; /* placed_arrays: bundles first */
  size_t total = 0;
  for (int32_t l = 0; l < s->n_layers; l++) {
    void **ptr[3];
    size_t size[3];
    placed_arrays(s, l, ptr, size);
    for (int i = first; i < 3; i++) total += (size[i] + ALIGN - 1) / ALIGN * ALIGN;
  }
  /* the predictors alone (under a budget) in small pages: a huge page's rounding would count
   * against it */
  uint8_t *arena = bundles ? npu_pages_alloc_huge(total) : npu_pages_alloc(total);
  if (arena == NULL) {
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory placing %zu MiB of sparse decode data",
                    total >> 20);
  }
  size_t off = 0;
  for (int32_t l = 0; l < s->n_layers; l++) {
    void **ptr[3];
    size_t size[3];
    placed_arrays(s, l, ptr, size);
    for (int i = first; i < 3; i++) {
      if (size[i] == 0) continue; /* a layer without a predictor */
      memcpy(arena + off, *ptr[i], size[i]);
      if (s->mapped) npu_pages_release(*ptr[i], size[i]);
      else free(*ptr[i]);
      *ptr[i] = arena + off;
      off += (size[i] + ALIGN - 1) / ALIGN * ALIGN;
    }
  }
  s->arena = arena;
  s->arena_size = total;
  s->bundles_placed = bundles;
  return NPULM_OK;
}

/* Whether site 's' is a layer's dense FFN matmul (gate, up, down). */
static bool is_dense_ffn(const struct npu_qsite *s) {
  const char *dot = strrchr(s->name, '.');
  return s->op == NPU_OP_MATMUL && dot != NULL &&
         (strcmp(dot, ".ffn_gate") == 0 || strcmp(dot, ".ffn_up") == 0 ||
          strcmp(dot, ".ffn_down") == 0);
}

uint64_t npu_sparse_streamed(const struct npu_program *p, uint64_t budget, uint8_t *streamed_out) {
  uint64_t held = 0;
  for (int32_t l = 0; p->sparse != NULL && l < p->sparse->n_layers; l++) {
    held += npu_sparse_predictor_bytes(p->sparse, l);
  }
  for (int32_t i = 0; i < p->n_qsites; i++) streamed_out[i] = 0;
  /* the others, smallest first: a selection sort of what is left (a few hundred sites) */
  for (;;) {
    int32_t best = -1;
    for (int32_t i = 0; i < p->n_qsites; i++) {
      const struct npu_qsite *s = &p->qsites[i];
      if (s->op != NPU_OP_MATMUL || s->table_site >= 0 || s->packed == NULL ||
          streamed_out[i] != 0) {
        continue;
      }
      if (is_dense_ffn(s)) {
        streamed_out[i] = 1;
        continue;
      }
      if (best < 0 || s->packed_size < p->qsites[best].packed_size) best = i;
    }
    if (best < 0) break;
    if ((held + p->qsites[best].packed_size) * 10 <= budget * 9) {
      held += p->qsites[best].packed_size;
      streamed_out[best] = 2; /* held: seen */
    } else {
      streamed_out[best] = 1;
    }
  }
  for (int32_t i = 0; i < p->n_qsites; i++) streamed_out[i] = streamed_out[i] == 1;
  return held;
}

void npu_sparse_free(struct npu_sparse *s) {
  if (s == NULL) return;
  for (int32_t l = 0; s->layers != NULL && l < s->n_layers; l++) {
    struct npu_sparse_layer *ly = &s->layers[l];
    if (!s->mapped && s->arena == NULL) {
      free(ly->pred_b);
      free(ly->pred_a);
    }
    if (!s->mapped && !s->bundles_placed) free(ly->bundles);
    free(ly->mult);
    free(ly->shift);
    free(ly->bias);
    free(ly->freq);
    free(ly->place);
  }
  free(s->layers);
  npu_pages_free(s->arena, s->arena_size);
  free(s);
}

bool npu_program_input_sparse(const struct npu_program *p) {
  for (int32_t i = 0; i < p->n_qsites; i++) {
    if (p->qsites[i].skip_below > 0) return true;
  }
  return false;
}
