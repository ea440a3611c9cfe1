/* The sparse decode data of a program file (program/sparse_data.h): written by the save, read and
 * checked by the load. Format (program_file.h):
 *   npulm.sparse.level     f32   the share of neurons skipped on the calibration text
 *   npulm.sparse.auto      f32[4], optional: --sparsity auto's decode perplexity over dense's on
 *                                the calibration text at sparsity 0.7, 0.5, 0.3, 0.15 (0: not
 * tried) npulm.sparse.layers    i32[12 * n_layers]: per layer n_ff, rank, kp, cand_hi, cand_lo_a,
 *                                cand_lo_b, hi, lo_a, lo_b, keep, cand, recall (the last six
 *                                f32 bits)
 *   tensors per layer L:   npulm.sparse.L.bundles I8 [kp, 3 n_ff] (program/sparse_data.h's
 *                          layout: neurons in the places their .freq gives); .pred_b, .pred_a I8
 * packed; .mult, .shift I32 [rank + n_ff] (these four absent at rank 0: no predictor); .bias I32 [2
 * n_ff]; .freq I32 [n_ff] Input-sparse decode (sparse_data.h, npu_input_sparse), optional:
 *   npulm.sparse_input.level   f32   the share of each sparsified matmul's input channels skipped
 *                                    on the calibration text, in (0, 1)
 *   npulm.sparse_input.auto    f32[4], optional: --sparsity auto's decode perplexity over dense's
 *                                    at 0.5, 0.4, 0.25, 0.1 (0: not tried)
 *   npulm.sparse_input.below   i32[n_sites]: each site's skip_below (0: dense; only matmuls)
 *   npulm.sparse_input.keep    f32[n_sites]: each site's share of channels kept on calibration
 * A reader without input-sparse decode runs such a file dense. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "io/gguf_write.h"
#include "program/program_file.h"
#include "program/sparse_data.h"

enum {
  F_N_FF,
  F_RANK,
  F_KP,
  F_CAND_HI,
  F_CAND_LO_A,
  F_CAND_LO_B,
  F_HI,
  F_LO_A,
  F_LO_B,
  F_KEEP,
  F_CAND,
  F_RECALL,
  SPARSE_FIELDS
};

static int32_t f32_bits(float f) {
  int32_t v;
  memcpy(&v, &f, sizeof(v));
  return v;
}

static float bits_f32(int32_t v) {
  float f;
  memcpy(&f, &v, sizeof(f));
  return f;
}

/* One layer's arrays; the predictor's four of no elements (not in the file) for a layer without
 * one (rank 0). */
static void layer_arrays(const struct npu_sparse *s, int32_t l, struct file_array *a) {
  const struct npu_sparse_layer *ly = &s->layers[l];
  const uint64_t n_ff = (uint64_t)ly->n_ff, r = (uint64_t)ly->rank;
  const bool pred = r > 0;
  a[0] = (struct file_array){"bundles", GGML_I8, ly->bundles, (uint64_t)s->kp, 3 * n_ff, 1};
  a[1] = (struct file_array){
      "pred_b", GGML_I8, ly->pred_b, pred ? npu_qs8_gemm_packed_size(r, (size_t)s->dim) : 0, 0, 1};
  a[2] = (struct file_array){
      "pred_a", GGML_I8, ly->pred_a, pred ? npu_qs8_gemm_packed_size(n_ff, r) : 0, 0, 1};
  a[3] = (struct file_array){"mult", GGML_I32, ly->mult, pred ? r + n_ff : 0, 0, 4};
  a[4] = (struct file_array){"shift", GGML_I32, ly->shift, pred ? r + n_ff : 0, 0, 4};
  a[5] = (struct file_array){"bias", GGML_I32, ly->bias, 2 * n_ff, 0, 4};
  a[6] = (struct file_array){"freq", GGML_I32, ly->freq, n_ff, 0, 4};
}

int32_t npu_program_sparse_tensors(const struct npu_program *p, struct file_tensor *ft, int32_t n) {
  const struct npu_sparse *s = p->sparse;
  for (int32_t l = 0; s != NULL && l < s->n_layers; l++) {
    struct file_array a[SPARSE_ARRAYS];
    layer_arrays(s, l, a);
    for (int i = 0; i < SPARSE_ARRAYS; i++) {
      if (a[i].ne0 > 0) npu_file_tensor_of(&ft[n++], "npulm.sparse", l, &a[i]);
    }
  }
  return n;
}

/* The input-sparse keys of 'p', if it has thresholds. */
static npulm_status add_input_sparse(struct npu_gguf_writer *w, const struct npu_program *p,
                                     npulm_error *err) {
  if (!npu_program_input_sparse(p)) return npu_gguf_writer_status(w, err);
  const size_t n = (size_t)p->n_qsites;
  int32_t *below = malloc(n * sizeof(int32_t));
  float *keep = malloc(n * sizeof(float));
  if (below == NULL || keep == NULL) {
    free(below);
    free(keep);
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  }
  for (size_t i = 0; i < n; i++) {
    below[i] = p->qsites[i].skip_below;
    keep[i] = p->qsites[i].skip_keep;
  }
  npu_gguf_writer_add_f32(w, "npulm.sparse_input.level", p->input_sparsity);
  bool tried = false;
  for (int i = 0; i < NPU_INPUT_AUTO_LEVELS; i++) tried |= p->input_auto_ratio[i] != 0.0f;
  if (tried) {
    npu_gguf_writer_add_arr(w, "npulm.sparse_input.auto", NPU_GGUF_F32, p->input_auto_ratio,
                            NPU_INPUT_AUTO_LEVELS);
  }
  npu_gguf_writer_add_arr(w, "npulm.sparse_input.below", NPU_GGUF_I32, below, n);
  npu_gguf_writer_add_arr(w, "npulm.sparse_input.keep", NPU_GGUF_F32, keep, n);
  free(below);
  free(keep);
  return npu_gguf_writer_status(w, err);
}

npulm_status npu_program_add_sparse(struct npu_gguf_writer *w, const struct npu_program *p,
                                    npulm_error *err) {
  const struct npu_sparse *s = p->sparse;
  npulm_status st = add_input_sparse(w, p, err);
  if (st != NPULM_OK || s == NULL) return st;
  int32_t *rec = malloc((size_t)s->n_layers * SPARSE_FIELDS * sizeof(int32_t));
  if (rec == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  for (int32_t l = 0; l < s->n_layers; l++) {
    const struct npu_sparse_layer *ly = &s->layers[l];
    int32_t *f = rec + (size_t)l * SPARSE_FIELDS;
    f[F_N_FF] = ly->n_ff;
    f[F_RANK] = ly->rank;
    f[F_KP] = s->kp;
    f[F_CAND_HI] = ly->cand_hi;
    f[F_CAND_LO_A] = ly->cand_lo_a;
    f[F_CAND_LO_B] = ly->cand_lo_b;
    f[F_HI] = f32_bits(ly->hi);
    f[F_LO_A] = f32_bits(ly->lo_a);
    f[F_LO_B] = f32_bits(ly->lo_b);
    f[F_KEEP] = f32_bits(ly->keep);
    f[F_CAND] = f32_bits(ly->cand);
    f[F_RECALL] = f32_bits(ly->recall);
  }
  npu_gguf_writer_add_f32(w, "npulm.sparse.level", s->level);
  bool tried = false;
  for (int i = 0; i < NPU_SPARSE_AUTO_LEVELS; i++) tried |= s->auto_ratio[i] != 0.0f;
  if (tried) {
    npu_gguf_writer_add_arr(w, "npulm.sparse.auto", NPU_GGUF_F32, s->auto_ratio,
                            NPU_SPARSE_AUTO_LEVELS);
  }
  npu_gguf_writer_add_arr(w, "npulm.sparse.layers", NPU_GGUF_I32, rec,
                          (size_t)s->n_layers * SPARSE_FIELDS);
  free(rec);
  return npu_gguf_writer_status(w, err);
}

/* Layer 'l' from its record 'f' and tensors. */
static npulm_status load_layer(const struct npu_gguf *g, const struct npu_config *cfg,
                               struct npu_sparse *s, int32_t l, const int32_t *f,
                               npulm_error *err) {
  struct npu_sparse_layer *ly = &s->layers[l];
  ly->n_ff = f[F_N_FF];
  ly->rank = f[F_RANK];
  ly->cand_hi = f[F_CAND_HI];
  ly->cand_lo_a = f[F_CAND_LO_A];
  ly->cand_lo_b = f[F_CAND_LO_B];
  ly->hi = bits_f32(f[F_HI]);
  ly->lo_a = bits_f32(f[F_LO_A]);
  ly->lo_b = bits_f32(f[F_LO_B]);
  ly->keep = bits_f32(f[F_KEEP]);
  ly->cand = bits_f32(f[F_CAND]);
  ly->recall = bits_f32(f[F_RECALL]);
  if (ly->n_ff != cfg->ffn_dim || ly->rank < 0 || ly->rank > ly->n_ff || f[F_KP] != s->kp ||
      isnan(ly->hi) || isnan(ly->lo_a) || isnan(ly->lo_b) ||
      !(ly->keep >= 0.0f && ly->keep <= 1.0f) || !(ly->cand >= 0.0f && ly->cand <= 1.0f) ||
      !(ly->recall >= 0.0f && ly->recall <= 1.0f)) {
    return npu_fail(err, NPULM_ERR_FORMAT, "'npulm.sparse.layers': layer %d's record is invalid",
                    l);
  }
  struct file_array a[SPARSE_ARRAYS];
  layer_arrays(s, l, a);
  const void *data[SPARSE_ARRAYS];
  for (int i = 0; i < SPARSE_ARRAYS; i++) {
    data[i] = NULL;
    if (a[i].ne0 == 0) continue; /* no predictor */
    char name[64];
    snprintf(name, sizeof(name), "npulm.sparse.%d.%s", l, a[i].field);
    const struct npu_gguf_tensor *t = npu_gguf_find_tensor(g, name);
    if (t == NULL || t->type != a[i].type || t->n_dims != (a[i].ne1 ? 2u : 1u) ||
        t->ne[0] != a[i].ne0 || (a[i].ne1 && t->ne[1] != a[i].ne1)) {
      return npu_fail(err, NPULM_ERR_FORMAT, "sparse tensor '%s' is missing or of another shape",
                      name);
    }
    data[i] = t->data;
  }
  const size_t n_ff = (size_t)ly->n_ff, r = (size_t)ly->rank;
  ly->bundles = (int8_t *)data[0];
  ly->pred_b = (void *)data[1];
  ly->pred_a = (void *)data[2];
  const size_t n_pred = r > 0 ? r + n_ff : 0; /* the predictor's channels */
  ly->mult = n_pred > 0 ? malloc(n_pred * sizeof(int32_t)) : NULL;
  ly->shift = n_pred > 0 ? malloc(n_pred * sizeof(int32_t)) : NULL;
  ly->bias = malloc(2 * n_ff * sizeof(int32_t));
  ly->freq = malloc(n_ff * sizeof(uint32_t));
  ly->place = malloc(n_ff * sizeof(int32_t));
  if ((n_pred > 0 && (ly->mult == NULL || ly->shift == NULL)) || ly->bias == NULL ||
      ly->freq == NULL || ly->place == NULL) {
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  }
  if (n_pred > 0) {
    memcpy(ly->mult, data[3], n_pred * sizeof(int32_t));
    memcpy(ly->shift, data[4], n_pred * sizeof(int32_t));
  }
  memcpy(ly->bias, data[5], 2 * n_ff * sizeof(int32_t));
  memcpy(ly->freq, data[6], n_ff * sizeof(uint32_t));
  if (!npu_sparse_places(ly->freq, ly->n_ff, ly->place))
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < n_pred; i++) {
    if (ly->mult[i] < 0 || ly->shift[i] < -31 || ly->shift[i] > 30) {
      return npu_fail(err, NPULM_ERR_FORMAT,
                      "sparse layer %d: predictor channel %zu has multiplier %d, shift %d", l, i,
                      ly->mult[i], ly->shift[i]);
    }
  }
  /* the dot products' accumulators plus a bias stay within int32 (|bias| <= 2^30, as packed) */
  for (size_t i = 0; i < 2 * n_ff; i++) {
    if (ly->bias[i] > (1 << 30) || ly->bias[i] < -(1 << 30)) {
      return npu_fail(err, NPULM_ERR_FORMAT, "sparse layer %d: bias %zu is out of range", l, i);
    }
  }
  return NPULM_OK;
}

/* An f32 array of 'n' values at 'key', each in [lo, hi], into 'out'. */
static npulm_status load_f32s(const struct npu_gguf *g, const char *key, size_t n, float lo,
                              float hi, float *out, npulm_error *err) {
  struct npu_gguf_arr a;
  npulm_status st = npu_gguf_get_arr(g, key, NPU_GGUF_F32, &a, err);
  if (st != NPULM_OK) return st;
  if (a.n != (uint64_t)n) {
    return npu_fail(err, NPULM_ERR_FORMAT, "'%s' has %llu values, not %zu", key,
                    (unsigned long long)a.n, n);
  }
  for (size_t i = 0; i < n; i++) {
    memcpy(&out[i], a.data + 4 * i, sizeof(float));
    if (!(out[i] >= lo && out[i] <= hi)) {
      return npu_fail(err, NPULM_ERR_FORMAT, "'%s' holds a value out of [%g, %g]", key, (double)lo,
                      (double)hi);
    }
  }
  return NPULM_OK;
}

/* The input-sparse keys, if present, into the sites (loaded before) and 'p'. */
static npulm_status load_input_sparse(const struct npu_gguf *g, struct npu_program *p,
                                      npulm_error *err) {
  if (npu_gguf_find(g, "npulm.sparse_input.level") == NULL) return NPULM_OK;
  const size_t n = (size_t)p->n_qsites;
  float level;
  struct npu_gguf_arr below;
  npulm_status st = npu_gguf_get_f32(g, "npulm.sparse_input.level", &level, err);
  if (st == NPULM_OK) {
    st = npu_gguf_get_arr(g, "npulm.sparse_input.below", NPU_GGUF_I32, &below, err);
  }
  if (st != NPULM_OK) return st;
  if (!(level > 0.0f && level < 1.0f) || below.n != (uint64_t)n || p->quant_mode == NPU_QUANT_F32) {
    return npu_fail(err, NPULM_ERR_FORMAT,
                    "the input-sparse decode data is malformed (level %g, %llu thresholds for "
                    "%zu sites)",
                    (double)level, (unsigned long long)below.n, n);
  }
  float *keep = malloc((n > 0 ? n : 1) * sizeof(float));
  if (keep == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  st = load_f32s(g, "npulm.sparse_input.keep", n, 0.0f, 1.0f, keep, err);
  for (size_t i = 0; st == NPULM_OK && i < n; i++) {
    struct npu_qsite *s = &p->qsites[i];
    int32_t v;
    memcpy(&v, below.data + 4 * i, sizeof(v));
    if (v < 0 || v > 32768 || (v > 0 && s->op != NPU_OP_MATMUL)) {
      st = npu_fail(err, NPULM_ERR_FORMAT, "site %zu's input-sparse threshold %d is not valid", i,
                    v);
    }
    s->skip_below = v;
    s->skip_keep = keep[i];
  }
  free(keep);
  if (st == NPULM_OK && npu_gguf_find(g, "npulm.sparse_input.auto") != NULL) {
    st = load_f32s(g, "npulm.sparse_input.auto", NPU_INPUT_AUTO_LEVELS, 0.0f, 1e6f,
                   p->input_auto_ratio, err);
  }
  if (st == NPULM_OK) p->input_sparsity = level;
  return st;
}

npulm_status npu_program_load_sparse(const struct npu_gguf *g, const struct npu_config *cfg,
                                     bool place, struct npu_program *p, npulm_error *err) {
  npulm_status st0 = load_input_sparse(g, p, err);
  if (st0 != NPULM_OK) return st0;
  if (npu_gguf_find(g, "npulm.sparse.level") == NULL) return NPULM_OK;
  float level;
  struct npu_gguf_arr rec;
  npulm_status st = npu_gguf_get_f32(g, "npulm.sparse.level", &level, err);
  if (st == NPULM_OK) st = npu_gguf_get_arr(g, "npulm.sparse.layers", NPU_GGUF_I32, &rec, err);
  if (st != NPULM_OK) return st;
  if (!(level >= 0.0f && level < 1.0f) || rec.n != (uint64_t)cfg->n_layers * SPARSE_FIELDS ||
      p->quant_mode == NPU_QUANT_F32) {
    return npu_fail(err, NPULM_ERR_FORMAT,
                    "the sparse decode data is malformed (level %g, %llu values for %d layers)",
                    (double)level, (unsigned long long)rec.n, cfg->n_layers);
  }
  struct npu_sparse *s = calloc(1, sizeof(*s));
  if (s == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  s->level = level;
  s->n_layers = cfg->n_layers;
  s->dim = cfg->dim;
  s->kp = (int32_t)npu_bundle_kp((size_t)cfg->dim);
  s->mapped = true;
  s->layers = calloc((size_t)cfg->n_layers, sizeof(*s->layers));
  if (s->layers == NULL) st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  for (int32_t l = 0; st == NPULM_OK && l < cfg->n_layers; l++) {
    int32_t f[SPARSE_FIELDS];
    for (int k = 0; k < SPARSE_FIELDS; k++) {
      int32_t v;
      memcpy(&v, rec.data + 4 * ((size_t)l * SPARSE_FIELDS + (size_t)k), sizeof(v));
      f[k] = v;
    }
    st = load_layer(g, cfg, s, l, f, err);
  }
  if (st != NPULM_OK) {
    npu_sparse_free(s);
    return st;
  }
  struct npu_gguf_arr ratios;
  if (npu_gguf_find(g, "npulm.sparse.auto") != NULL) {
    st = npu_gguf_get_arr(g, "npulm.sparse.auto", NPU_GGUF_F32, &ratios, err);
    if (st == NPULM_OK && ratios.n != NPU_SPARSE_AUTO_LEVELS) {
      st = npu_fail(err, NPULM_ERR_FORMAT, "'npulm.sparse.auto' has %llu values, not %d",
                    (unsigned long long)ratios.n, NPU_SPARSE_AUTO_LEVELS);
    }
    for (int i = 0; st == NPULM_OK && i < NPU_SPARSE_AUTO_LEVELS; i++) {
      memcpy(&s->auto_ratio[i], ratios.data + 4 * (size_t)i, sizeof(float));
      if (!(s->auto_ratio[i] >= 0.0f && s->auto_ratio[i] < 1e6f)) {
        st = npu_fail(err, NPULM_ERR_FORMAT, "'npulm.sparse.auto' holds a value that is no ratio");
      }
    }
    if (st != NPULM_OK) {
      npu_sparse_free(s);
      return st;
    }
  }
  if (place && (st = npu_sparse_place(s, true, err)) != NPULM_OK) {
    npu_sparse_free(s);
    return st;
  }
  p->sparse = s;
  return NPULM_OK;
}
