/* Saving a program file: the source model's metadata, the program's records, the weights and the
 * sites' integer arrays, written whole or not at all (npu_program_save). The file format is
 * described in program_file.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/atomic_file.h"
#include "base/common.h"
#include "base/pages.h"
#include "io/gguf_checksum.h"
#include "io/gguf_write.h"
#include "program/program.h"
#include "program/program_file.h"
#include "program/sparse_data.h"

#define SMALL_TENSOR_BYTES (64u << 10) /* tensors below this are stored together, first */
#define WRITE_CHUNK_BYTES (4u << 20)   /* weight bytes between progress calls */

/* ---- Saving --------------------------------------------------------------------------------- */

/* Append the encoded value 'v' (what follows its type in a GGUF file) to 'b'. */
static void encode_value(struct npu_gguf_buf *b, const struct npu_gguf_value *v) {
  switch ((enum npu_gguf_vtype)v->type) {
  case NPU_GGUF_U8:
  case NPU_GGUF_BOOL: npu_gguf_buf_put_u8(b, (uint8_t)v->v.u); break;
  case NPU_GGUF_I8: npu_gguf_buf_put_u8(b, (uint8_t)(int8_t)v->v.i); break;
  case NPU_GGUF_U16: npu_gguf_buf_put_u16(b, (uint16_t)v->v.u); break;
  case NPU_GGUF_I16: npu_gguf_buf_put_u16(b, (uint16_t)(int16_t)v->v.i); break;
  case NPU_GGUF_U32: npu_gguf_buf_put_u32(b, (uint32_t)v->v.u); break;
  case NPU_GGUF_I32: npu_gguf_buf_put_u32(b, (uint32_t)(int32_t)v->v.i); break;
  case NPU_GGUF_U64: npu_gguf_buf_put_u64(b, v->v.u); break;
  case NPU_GGUF_I64: npu_gguf_buf_put_u64(b, (uint64_t)v->v.i); break;
  case NPU_GGUF_F32: npu_gguf_buf_put_f32(b, (float)v->v.f); break;
  case NPU_GGUF_F64: npu_gguf_buf_put_f64(b, v->v.f); break;
  case NPU_GGUF_STR: npu_gguf_buf_put_strn(b, v->v.s.ptr, (size_t)v->v.s.len); break;
  case NPU_GGUF_ARR:
    /* the elements were validated in place and are stored back to back: copy them whole */
    npu_gguf_buf_put_u32(b, v->v.a.type);
    npu_gguf_buf_put_u64(b, v->v.a.n);
    npu_gguf_buf_put(b, v->v.a.data, (size_t)v->v.a.size);
    break;
  case NPU_GGUF_VTYPE_COUNT: break;
  }
}

/* The source model's metadata, value for value, except the keys this file owns. */
static npulm_status copy_metadata(struct npu_gguf_writer *w, const struct npu_gguf *src,
                                  npulm_error *err) {
  struct npu_gguf_buf b = {0};
  char *key = NULL;
  npulm_status st = NPULM_OK;
  for (uint64_t i = 0; i < src->n_kv && st == NPULM_OK; i++) {
    const struct npu_gguf_kv *kv = &src->kv[i];
    free(key);
    key = malloc((size_t)kv->key.len + 1);
    if (key == NULL) {
      st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory copying metadata");
      break;
    }
    memcpy(key, kv->key.ptr, (size_t)kv->key.len);
    key[kv->key.len] = '\0';
    if (strlen(key) != kv->key.len || strcmp(key, "general.alignment") == 0 ||
        strncmp(key, "npulm.", 6) == 0) {
      continue; /* a key with a NUL byte cannot be re-added; the others are rewritten */
    }
    if (strcmp(key, "general.file_type") == 0) {
      st = npu_gguf_writer_add_u32(w, key, 0); /* LLAMA_FTYPE_ALL_F32: the weights are F32 now */
      continue;
    }
    b.size = 0;
    encode_value(&b, &kv->val);
    if (b.failed) {
      st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory copying metadata");
      break;
    }
    st = npu_gguf_writer_add_raw(w, key, kv->val.type, b.data, b.size);
  }
  free(key);
  npu_gguf_buf_free(&b);
  if (npu_gguf_writer_status(w, NULL) != NPULM_OK) return npu_gguf_writer_status(w, err);
  return st;
}

/* The records of graph 'gi' of 'p' as metadata; a tensor named as its record implies
 * (npu_program_tensor_name) has an empty name. */
static npulm_status add_graph(struct npu_gguf_writer *w, const struct npu_program *p, int32_t gi,
                              const struct npu_graph *g, npulm_error *err) {
  size_t n_rec = (size_t)g->n_tensors * TENSOR_FIELDS;
  if ((size_t)g->n_nodes * NODE_FIELDS > n_rec) n_rec = (size_t)g->n_nodes * NODE_FIELDS;
  if ((size_t)g->n_subgraphs * SUBGRAPH_FIELDS > n_rec)
    n_rec = (size_t)g->n_subgraphs * SUBGRAPH_FIELDS;
  int32_t *rec = malloc((n_rec ? n_rec : 1) * sizeof(*rec));
  const char **names = malloc((size_t)(g->n_tensors ? g->n_tensors : 1) * sizeof(*names));
  if (rec == NULL || names == NULL) {
    free(rec);
    free(names);
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory writing graph %d", gi);
  }
  char key[96];
  int32_t info[INFO_FIELDS];
  npu_record_store(INFO_TABLE, INFO_FIELDS, g, ALL_GROUPS, info);
  snprintf(key, sizeof(key), "npulm.graph.%d.info", gi);
  npu_gguf_writer_add_arr(w, key, NPU_GGUF_I32, info, INFO_FIELDS);
  snprintf(key, sizeof(key), "npulm.graph.%d.arena_size", gi);
  npu_gguf_writer_add_arr(w, key, NPU_GGUF_U64, g->arena_size, NPU_BE_COUNT);

  for (int32_t i = 0; i < g->n_tensors; i++) {
    const struct npu_ir_tensor *t = &g->tensors[i];
    npu_record_store(TENSOR_TABLE, TENSOR_FIELDS, t, ALL_GROUPS, rec + (size_t)i * TENSOR_FIELDS);
    char implied[NPU_IR_NAME_MAX];
    bool derived = npu_program_tensor_name(p->weights, p->n_weights, t, implied);
    if (!derived && t->name[0] == '\0') {
      free(rec);
      free(names);
      return npu_fail(err, NPULM_ERR_ARG, "graph %d: tensor %d has no name", gi, i);
    }
    names[i] = derived && strcmp(implied, t->name) == 0 ? "" : t->name;
  }
  snprintf(key, sizeof(key), "npulm.graph.%d.tensors", gi);
  npu_gguf_writer_add_arr(w, key, NPU_GGUF_I32, rec, (size_t)g->n_tensors * TENSOR_FIELDS);
  snprintf(key, sizeof(key), "npulm.graph.%d.tensor_names", gi);
  npu_gguf_writer_add_arr_str(w, key, names, (size_t)g->n_tensors);

  for (int32_t i = 0; i < g->n_nodes; i++) {
    npu_record_store(NODE_TABLE, NODE_FIELDS, &g->nodes[i], ALL_GROUPS,
                     rec + (size_t)i * NODE_FIELDS);
  }
  snprintf(key, sizeof(key), "npulm.graph.%d.nodes", gi);
  npu_gguf_writer_add_arr(w, key, NPU_GGUF_I32, rec, (size_t)g->n_nodes * NODE_FIELDS);

  for (int32_t s = 0; s < g->n_subgraphs; s++) {
    npu_record_store(SUBGRAPH_TABLE, SUBGRAPH_FIELDS, &g->subgraphs[s], ALL_GROUPS,
                     rec + (size_t)s * SUBGRAPH_FIELDS);
  }
  snprintf(key, sizeof(key), "npulm.graph.%d.subgraphs", gi);
  npu_gguf_writer_add_arr(w, key, NPU_GGUF_I32, rec, (size_t)g->n_subgraphs * SUBGRAPH_FIELDS);
  free(rec);
  free(names);
  return npu_gguf_writer_status(w, err);
}

/* The npulm.weights.float value of each weight of the table (WEIGHT_*): whether the file holds
 * it. An integer program holds only the weights the executor reads in float unless it keeps them
 * all (keep_float); a tied output, listed under the embedding's name, is held when the embedding
 * is. A model read from a lean file has no view of what that file left out: left out again. */
enum { WEIGHT_ABSENT = 0, WEIGHT_HELD = 1, WEIGHT_INT8_ONLY = 2 };
static void weight_flags(const struct npulm_model *m, const struct npu_program *p,
                         const bool *reads, uint8_t *flags) {
  const bool all = p->keep_float || p->quant_mode == NPU_QUANT_F32;
  for (int32_t i = 0; i < p->n_weights; i++) {
    bool held = all || reads[i];
    for (int32_t j = 0; j < p->n_weights && !held; j++) {
      held = reads[j] && strcmp(p->weights[j].name, p->weights[i].name) == 0;
    }
    if (p->weights[i].data == NULL) {
      flags[i] = npu_model_omits(m, p->weights[i].name) || p->weights[i].deferred ? WEIGHT_INT8_ONLY
                                                                                  : WEIGHT_ABSENT;
    } else {
      flags[i] = held ? WEIGHT_HELD : WEIGHT_INT8_ONLY;
    }
  }
}

/* Every weight the file holds ('flags', weight_flags), each once: the weight table's (a tied
 * output shares the embedding's name) and the llama 3 RoPE frequencies. Shapes as in the source
 * file. */
static int32_t file_weights(const struct npulm_model *m, const struct npu_program *p,
                            const uint8_t *flags, struct file_tensor *fw) {
  int32_t n = 0;
  for (int32_t i = 0; i < p->n_weights; i++) {
    const struct npu_weight *w = &p->weights[i];
    bool seen = flags[i] != WEIGHT_HELD;
    for (int32_t j = 0; j < n && !seen; j++) seen = strcmp(fw[j].name, w->name) == 0;
    if (seen) continue;
    fw[n] = (struct file_tensor){.name = w->name,
                                 .type = NPU_GGML_F32,
                                 .data = w->data,
                                 .n_dims = w->ne1 == 1 ? 1 : 2,
                                 .ne = {(uint64_t)w->ne0, (uint64_t)w->ne1}};
    const struct npu_gguf_tensor *t = npu_gguf_find_tensor(m->gguf, w->name);
    if (t != NULL && t->n_dims == 2 && t->ne[0] == fw[n].ne[0] && t->ne[1] == fw[n].ne[1]) {
      fw[n].n_dims = 2; /* a matrix of one row stays a matrix */
    }
    n++;
  }
  if (m->w.rope_freqs != NULL) {
    fw[n++] = (struct file_tensor){.name = "rope_freqs.weight",
                                   .type = NPU_GGML_F32,
                                   .data = m->w.rope_freqs,
                                   .n_dims = 1,
                                   .ne = {(uint64_t)m->cfg.rope_dim / 2, 1}};
  }
  for (int32_t i = 0; i < n; i++) fw[i].bytes = fw[i].ne[0] * fw[i].ne[1] * sizeof(float);
  return n;
}

/* The arrays of site 'si' (at most SITE_ARRAYS of them) appended to 'ft' from 'n'; its shifts
 * are stored from 'shift8' (its s->shift narrowed, see narrow_shifts). */
#define SITE_ARRAYS 7
static int32_t site_tensors(const struct npu_qsite *s, int32_t si, const int8_t *shift8,
                            struct file_tensor *ft, int32_t n) {
  const struct file_array arrays[SITE_ARRAYS] = {
      {"packed", GGML_I8, s->packed, s->packed_size, 0, 1},
      {"mult", GGML_I32, s->mult, (uint64_t)s->n, 0, 4},
      {"shift", GGML_I8, shift8, (uint64_t)s->n, 0, 1},
      {"outliers", GGML_I32, s->outliers, (uint64_t)s->n_outliers, 0, 4},
      {"outlier_w", NPU_GGML_F32, s->outlier_w, (uint64_t)s->n_outliers, (uint64_t)s->n, 4},
      {"outlier_gate", NPU_GGML_F32, s->outlier_gate, (uint64_t)s->outlier_dim,
       (uint64_t)s->n_outliers, 4},
      {"outlier_up", NPU_GGML_F32, s->outlier_up, (uint64_t)s->outlier_dim, (uint64_t)s->n_outliers,
       4},
  };
  const uint32_t sites = npu_op_info((enum npu_op)s->op)->sites;
  const bool table = sites & NPU_SITE_TABLE;
  for (int a = 0; a < SITE_ARRAYS; a++) {
    /* the packed table and multipliers of a matmul or gather; the outlier arrays it has */
    bool has = table ? (a == 0  ? s->table_site < 0
                        : a < 3 ? true
                        : a < 5 ? s->n_outliers > 0
                                : s->outlier_dim > 0)
                     : (sites & NPU_SITE_RMSNORM) && a == 1;
    if (has) npu_file_tensor_of(&ft[n++], "npulm.qsite", si, &arrays[a]);
  }
  return n;
}

/* The per-channel shifts of every site of 'p' that has them, as the file stores them (I8), one
 * site after another into '*out' (malloc'd; NULL when none). A shift outside int8 (the kernels
 * take -31 .. 30, npu_program_verify) is an error. */
static npulm_status narrow_shifts(const struct npu_program *p, int8_t **out, npulm_error *err) {
  size_t total = 0;
  *out = NULL;
  for (int32_t i = 0; i < p->n_qsites; i++) {
    if (p->qsites[i].shift != NULL) total += (size_t)p->qsites[i].n;
  }
  if (total == 0) return NPULM_OK;
  int8_t *s8 = malloc(total);
  if (s8 == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory writing the shifts");
  size_t k = 0;
  for (int32_t i = 0; i < p->n_qsites; i++) {
    const struct npu_qsite *s = &p->qsites[i];
    for (int32_t c = 0; s->shift != NULL && c < s->n; c++) {
      if (s->shift[c] < INT8_MIN || s->shift[c] > INT8_MAX) {
        free(s8);
        return npu_program_site_fail(err, p, i, "channel %d has shift %d, which no I8 holds", c,
                                     s->shift[c]);
      }
      s8[k++] = (int8_t)s->shift[c];
    }
  }
  *out = s8;
  return NPULM_OK;
}

/* The integer half of program 'p' as metadata (its arrays are tensors, see site_tensors). */
static npulm_status add_quant(struct npu_gguf_writer *w, const struct npu_program *p,
                              npulm_error *err) {
  npu_gguf_writer_add_u32(w, "npulm.quant.mode", (uint32_t)p->quant_mode);
  if (p->quant_mode == NPU_QUANT_F32) return npu_gguf_writer_status(w, err);
  npu_gguf_writer_add_f32(w, "npulm.quant.smooth_alpha", p->smooth_alpha);
  npu_gguf_writer_add_f32(w, "npulm.quant.shadow_threshold", p->shadow_threshold);
  size_t n_rec = (size_t)p->n_qtensors * QTENSOR_FIELDS;
  if ((size_t)p->n_qsites * SITE_FIELDS > n_rec) n_rec = (size_t)p->n_qsites * SITE_FIELDS;
  size_t n_names = (size_t)(p->n_qtensors > p->n_qsites ? p->n_qtensors : p->n_qsites);
  int32_t *rec = malloc((n_rec ? n_rec : 1) * sizeof(*rec));
  const char **names = malloc((n_names ? n_names : 1) * sizeof(*names));
  int8_t *luts = malloc((size_t)(p->n_qsites ? p->n_qsites : 1) * LUT_SIZE);
  int16_t *luts16 = malloc((size_t)(p->n_qsites ? p->n_qsites : 1) * LUT16_SIZE * 2);
  if (rec == NULL || names == NULL || luts == NULL || luts16 == NULL) {
    free(rec);
    free(names);
    free(luts);
    free(luts16);
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory writing the integer data");
  }
  for (int32_t i = 0; i < p->n_qtensors; i++) {
    const struct npu_qtensor *t = &p->qtensors[i];
    npu_record_store(QTENSOR_TABLE, QTENSOR_FIELDS, t, ALL_GROUPS,
                     rec + (size_t)i * QTENSOR_FIELDS);
    names[i] = t->name;
  }
  npu_gguf_writer_add_arr(w, "npulm.qtensors", NPU_GGUF_I32, rec,
                          (size_t)p->n_qtensors * QTENSOR_FIELDS);
  npu_gguf_writer_add_arr_str(w, "npulm.qtensor_names", names, (size_t)p->n_qtensors);
  size_t n_luts = 0, n_luts16 = 0;
  for (int32_t i = 0; i < p->n_qsites; i++) {
    const struct npu_qsite *s = &p->qsites[i];
    npu_record_store(SITE_TABLE, SITE_FIELDS, s, npu_site_record_groups((enum npu_op)s->op),
                     rec + (size_t)i * SITE_FIELDS);
    if ((npu_op_info((enum npu_op)s->op)->sites & NPU_SITE_LUT) && s->lut_wide) {
      memcpy(luts16 + n_luts16++ * LUT16_SIZE, s->lut16, sizeof(s->lut16));
    } else if (npu_op_info((enum npu_op)s->op)->sites & NPU_SITE_LUT) {
      memcpy(luts + n_luts++ * LUT_SIZE, s->lut, LUT_SIZE);
    }
    names[i] = s->name;
  }
  npu_gguf_writer_add_arr(w, "npulm.qsites", NPU_GGUF_I32, rec, (size_t)p->n_qsites * SITE_FIELDS);
  npu_gguf_writer_add_arr_str(w, "npulm.qsite_names", names, (size_t)p->n_qsites);
  npu_gguf_writer_add_arr(w, "npulm.qsites.luts", NPU_GGUF_I8, luts, n_luts * LUT_SIZE);
  npu_gguf_writer_add_arr(w, "npulm.qsites.luts16", NPU_GGUF_I16, luts16, n_luts16 * LUT16_SIZE);
  bool borrowed = false;
  for (int32_t i = 0; i < p->n_qsites; i++) {
    rec[i] = p->qsites[i].table_site;
    borrowed |= rec[i] >= 0;
  }
  if (borrowed) {
    npu_gguf_writer_add_arr(w, "npulm.qsites.tables", NPU_GGUF_I32, rec, (size_t)p->n_qsites);
  }
  free(rec);
  free(names);
  free(luts);
  free(luts16);
  return npu_gguf_writer_status(w, err);
}

npulm_status npu_program_save(const struct npulm_model *m, const struct npu_program *p,
                              const char *path, npulm_progress_fn progress, void *user,
                              npulm_error *err) {
  struct npu_gguf_writer *w = NULL;
  size_t cap = (size_t)p->n_weights + 1 + (size_t)p->n_qsites * SITE_ARRAYS +
               (p->sparse != NULL ? (size_t)p->sparse->n_layers * SPARSE_ARRAYS : 0);
  struct file_tensor *ft = calloc(cap, sizeof(*ft));
  int32_t *order = calloc(cap, sizeof(*order)); /* the order the tensors are written in */
  const char **weight_names = calloc((size_t)p->n_weights + 1, sizeof(*weight_names));
  bool *reads = calloc((size_t)p->n_weights + 1, sizeof(*reads));
  uint8_t *flags = calloc((size_t)p->n_weights + 1, sizeof(*flags));
  int8_t *shift8 = NULL; /* the sites' shifts as stored */
  npulm_status st;
  if (ft == NULL || order == NULL || weight_names == NULL || reads == NULL || flags == NULL) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
    goto fail;
  }
  /* the written file would take the place of the one the weights are read from: even written
   * safely, that destroys the user's model file, which is never what was meant */
  if (npu_gguf_is_file(m->gguf, path)) {
    st = npu_fail(err, NPULM_ERR_ARG,
                  "'%s' is the model's own file: write the output to another path", path);
    goto fail;
  }
  if ((st = npu_gguf_writer_open_file(path, &w, err)) != NPULM_OK) goto fail;
  npu_gguf_writer_add_u32(w, "general.alignment", FILE_ALIGNMENT);
  if ((st = copy_metadata(w, m->gguf, err)) != NPULM_OK) goto fail;

  /* the program */
  for (int32_t i = 0; i < p->n_weights; i++) weight_names[i] = p->weights[i].name;
  npu_program_float_weights(p, reads);
  weight_flags(m, p, reads, flags);
  npu_gguf_writer_add_u32(w, NPU_PROGRAM_KEY_VERSION, NPU_PROGRAM_VERSION);
  npu_gguf_writer_add_checksums(w, NPU_PROGRAM_CHECKSUMS);
  npu_gguf_writer_add_arr(w, "npulm.compile.chunks", NPU_GGUF_I32, p->opts.chunks,
                          (size_t)p->opts.n_chunks);
  npu_gguf_writer_add_arr(w, "npulm.compile.buckets", NPU_GGUF_I32, p->opts.buckets,
                          (size_t)p->opts.n_buckets);
  npu_gguf_writer_add_u32(w, "npulm.compile.float_ops", p->opts.float_ops);
  npu_gguf_writer_add_arr_str(w, "npulm.weights", weight_names, (size_t)p->n_weights);
  npu_gguf_writer_add_arr(w, "npulm.weights.float", NPU_GGUF_U8, flags, (size_t)p->n_weights);
  npu_gguf_writer_add_u32(w, "npulm.graph.count", (uint32_t)p->n_graphs);
  for (int32_t i = 0; i < p->n_graphs; i++) {
    if ((st = add_graph(w, p, i, &p->graphs[i], err)) != NPULM_OK) goto fail;
  }
  if ((st = add_quant(w, p, err)) != NPULM_OK) goto fail;
  if ((st = npu_program_add_sparse(w, p, err)) != NPULM_OK) goto fail;

  /* the weights, then the sites' arrays */
  int32_t n_ft = file_weights(m, p, flags, ft);
  if (p->quant_mode != NPU_QUANT_F32 && (st = narrow_shifts(p, &shift8, err)) != NPULM_OK) {
    goto fail;
  }
  for (int32_t i = 0, k = 0; i < p->n_qsites && p->quant_mode != NPU_QUANT_F32; i++) {
    n_ft = site_tensors(&p->qsites[i], i, shift8 != NULL ? shift8 + k : NULL, ft, n_ft);
    if (p->qsites[i].shift != NULL) k += p->qsites[i].n;
  }
  n_ft = npu_program_sparse_tensors(p, ft, n_ft);
  /* the small tensors (norms, biases, multipliers) first, side by side: the CPU reads the norms
   * at run time, and a page cache of large folios maps a whole folio (up to megabytes) for one
   * touched page, so each norm stored between two big F32 matrices would bring a megabyte of
   * them into the resident set */
  int32_t n_order = 0;
  for (int pass = 0; pass < 2; pass++) {
    for (int32_t i = 0; i < n_ft; i++) {
      if ((ft[i].bytes < SMALL_TENSOR_BYTES) == (pass == 0)) order[n_order++] = i;
    }
  }
  uint64_t total = 0, done = 0;
  for (int32_t o = 0; o < n_ft; o++) {
    const struct file_tensor *t = &ft[order[o]];
    npu_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, NULL);
    total += t->bytes;
  }
  if ((st = npu_gguf_writer_status(w, err)) != NPULM_OK) goto fail;
  if (progress != NULL) progress(user, 0, total);
  for (int32_t o = 0; o < n_ft; o++) {
    const int32_t i = order[o];
    const uint8_t *data = (const uint8_t *)ft[i].data;
    uint64_t left = ft[i].bytes;
    while (left > 0) {
      size_t k = left < WRITE_CHUNK_BYTES ? (size_t)left : WRITE_CHUNK_BYTES;
      if ((st = npu_gguf_writer_write_data(w, data, k, err)) != NPULM_OK) goto fail;
      if (p->spill != NULL && data >= p->spill && data < p->spill + p->spill_size) {
        npu_pages_release(data, k); /* a streaming compile's packed weights: written, let go */
      }
      data += k;
      left -= k;
      done += k;
      if (progress != NULL) progress(user, done, total);
    }
  }
  st = npu_gguf_writer_finish(w, err);
fail:
  npu_gguf_writer_free(w); /* removes the file unless finished */
  free(ft);
  free(order);
  free(weight_names);
  free(reads);
  free(flags);
  free(shift8);
  return st;
}
