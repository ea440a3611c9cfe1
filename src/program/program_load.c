/* Loading a program file: the checksums first (npu_program_file_check), then every record,
 * range-checked, into a program that npu_program_verify then checks whole (npu_program_load).
 * The file format is described in program_file.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "io/gguf_checksum.h"
#include "program/program.h"
#include "program/program_file.h"
#include "program/sparse_data.h"

#define DAMAGE_NAME_MAX 112 /* "tensor '...'" with up to 96 bytes of a name */

static float bits_f32(int32_t v) {
  float f;
  memcpy(&f, &v, sizeof(f));
  return f;
}

/* Element i of an (already bounds-checked) i32 array in the mapping. */
static int32_t arr_i32(const struct npu_gguf_arr *a, uint64_t i) {
  int32_t v;
  memcpy(&v, a->data + 4 * i, sizeof(v));
  return v;
}

/* Record 'i' of 'fields' values of the (already bounds-checked) i32 array 'a', into 'f'. */
static void record_at(const struct npu_gguf_arr *a, int32_t i, int fields, int32_t *f) {
  for (int k = 0; k < fields; k++) f[k] = arr_i32(a, (uint64_t)i * (uint64_t)fields + (uint64_t)k);
}

/* Sizes derived from the model and options (as npu_compile computes them). */
static void program_sizes(const struct npulm_model *m, struct npu_program *p) {
  const struct npu_config *c = &m->cfg;
  p->weight_bytes = 0;
  for (int32_t i = 0; i < p->n_weights; i++) {
    bool seen = p->weights[i].data == NULL;
    for (int32_t j = 0; j < i && !seen; j++) seen = p->weights[j].data == p->weights[i].data;
    if (!seen) p->weight_bytes += (uint64_t)p->weights[i].ne0 * (uint64_t)p->weights[i].ne1 * 4;
  }
  p->kv_bytes = 2ull * (uint64_t)c->n_layers * (uint64_t)p->opts.buckets[p->opts.n_buckets - 1] *
                (uint64_t)(c->n_kv_heads * c->head_dim) * sizeof(float);
}

/* ---- Loading -------------------------------------------------------------------------------- */

/* The version check of npu_program_file_check. */
static npulm_status check_version(const struct npu_gguf *g, bool *is_program, npulm_error *err) {
  *is_program = npu_gguf_find(g, NPU_PROGRAM_KEY_VERSION) != NULL;
  if (!*is_program) return NPULM_OK;
  uint32_t version;
  npulm_status st = npu_gguf_get_u32(g, NPU_PROGRAM_KEY_VERSION, &version, err);
  if (st != NPULM_OK) return st;
  if (version != NPU_PROGRAM_VERSION) {
    return npu_fail(err, NPULM_ERR_UNSUPPORTED,
                    "program file version %u is not supported (this npulm reads version %d; "
                    "recompile the model)",
                    version, NPU_PROGRAM_VERSION);
  }
  return NPULM_OK;
}

/* npu_program_file_damage for a file whose version was checked. */
static npulm_status scan_damage(const struct npu_gguf *g, npu_damage_fn damaged, void *user,
                                int64_t *n_damaged, npulm_error *err) {
  *n_damaged = 0;
  struct npu_gguf_arr sums;
  npulm_error inner;
  if (npu_gguf_checksums_find(g, NPU_PROGRAM_CHECKSUMS, &sums, &inner) != NPULM_OK) {
    return npu_program_fail_prefixed(err, NPULM_ERR_FORMAT, "program file checksums", &inner);
  }
  for (uint64_t r = 0; r < sums.n; r++) {
    const bool sound = npu_gguf_checksum_compute(g, &sums, r) == npu_gguf_checksum_stored(&sums, r);
    if (g->stream && r > 0) { /* under a memory budget: read through once, not kept */
      uint64_t begin, end;
      npu_gguf_region_bounds(g, r, &begin, &end);
      npu_gguf_drop(g, begin, end, true);
    }
    if (sound) continue;
    ++*n_damaged;
    if (damaged == NULL) continue;
    char what[DAMAGE_NAME_MAX];
    if (r == 0) {
      snprintf(what, sizeof(what), "the header");
    } else {
      const struct npu_gguf_str *s = &g->tensors[r - 1].name;
      snprintf(what, sizeof(what), "tensor '%.*s'", (int)(s->len < 96 ? s->len : 96), s->ptr);
    }
    uint64_t begin, end;
    npu_gguf_region_bounds(g, r, &begin, &end);
    damaged(user, what, begin, end);
  }
  return NPULM_OK;
}

struct first_damage {
  char what[DAMAGE_NAME_MAX];
  uint64_t begin, end;
};

static void note_first_damage(void *user, const char *what, uint64_t begin, uint64_t end) {
  struct first_damage *f = user;
  if (f->what[0] != '\0') return;
  snprintf(f->what, sizeof(f->what), "%s", what);
  f->begin = begin;
  f->end = end;
}

npulm_status npu_program_file_damage(const struct npu_gguf *g, npu_damage_fn damaged, void *user,
                                     int64_t *n_damaged, npulm_error *err) {
  *n_damaged = 0;
  bool is_program;
  npulm_status st = check_version(g, &is_program, err);
  if (st != NPULM_OK) return st;
  if (!is_program) {
    return npu_fail(err, NPULM_ERR_FORMAT, "not a program file (no '%s')", NPU_PROGRAM_KEY_VERSION);
  }
  return scan_damage(g, damaged, user, n_damaged, err);
}

npulm_status npu_program_file_check(const struct npu_gguf *g, bool *is_program, npulm_error *err) {
  npulm_status st = check_version(g, is_program, err);
  if (st != NPULM_OK || !*is_program) return st;
  struct first_damage first = {0};
  int64_t n;
  if ((st = scan_damage(g, note_first_damage, &first, &n, err)) != NPULM_OK) return st;
  if (n > 0) {
    return npu_fail(err, NPULM_ERR_FORMAT,
                    "program file is damaged: the checksum of %s (bytes %llu-%llu) does not match"
                    "%s; `npulm verify` lists every damaged part",
                    first.what, (unsigned long long)first.begin, (unsigned long long)first.end,
                    n > 1 ? ", nor do others" : "");
  }
  return NPULM_OK;
}

/* An i32 array under 'key' of records of 'fields' values: '*n' records. */
static npulm_status get_records(const struct npu_gguf *g, const char *key, uint64_t fields,
                                struct npu_gguf_arr *a, int32_t *n, npulm_error *err) {
  npulm_status st = npu_gguf_get_arr(g, key, NPU_GGUF_I32, a, err);
  if (st != NPULM_OK) return st;
  if (a->n % fields != 0 || a->n / fields > INT32_MAX / 4) {
    return npu_fail(err, NPULM_ERR_FORMAT,
                    "metadata key '%s' has %llu values, not a whole number of %llu-value records",
                    key, (unsigned long long)a->n, (unsigned long long)fields);
  }
  *n = (int32_t)(a->n / fields);
  return NPULM_OK;
}

/* An i32 array of at most 'max' values, copied to 'out'. */
static npulm_status get_i32_list(const struct npu_gguf *g, const char *key, int32_t max,
                                 int32_t *out, int32_t *n, npulm_error *err) {
  struct npu_gguf_arr a;
  npulm_status st = npu_gguf_get_arr(g, key, NPU_GGUF_I32, &a, err);
  if (st != NPULM_OK) return st;
  if (a.n > (uint64_t)max) {
    return npu_fail(err, NPULM_ERR_FORMAT, "metadata key '%s' has %llu values (at most %d)", key,
                    (unsigned long long)a.n, max);
  }
  for (uint64_t i = 0; i < a.n; i++) out[i] = arr_i32(&a, i);
  *n = (int32_t)a.n;
  return NPULM_OK;
}

static npulm_status load_options(const struct npu_gguf *g, struct npu_compile_options *o,
                                 npulm_error *err) {
  memset(o, 0, sizeof(*o));
  npulm_status st;
  if ((st = get_i32_list(g, "npulm.compile.chunks", NPU_MAX_CHUNKS, o->chunks, &o->n_chunks,
                         err)) != NPULM_OK ||
      (st = get_i32_list(g, "npulm.compile.buckets", NPU_MAX_BUCKETS, o->buckets, &o->n_buckets,
                         err)) != NPULM_OK ||
      (st = npu_gguf_get_u32(g, "npulm.compile.float_ops", &o->float_ops, err)) != NPULM_OK) {
    return st;
  }
  return NPULM_OK;
}

/* The stored weight-name list must be the model's weight table, name for name. */
static npulm_status check_weight_names(const struct npu_gguf *g, const struct npu_program *p,
                                       npulm_error *err) {
  struct npu_gguf_arr a;
  npulm_status st = npu_gguf_get_arr(g, "npulm.weights", NPU_GGUF_STR, &a, err);
  if (st != NPULM_OK) return st;
  if (a.n != (uint64_t)p->n_weights) {
    return npu_fail(err, NPULM_ERR_FORMAT,
                    "program lists %llu weights but the model's weight table has %d",
                    (unsigned long long)a.n, p->n_weights);
  }
  struct npu_gguf_value *names = malloc((size_t)(a.n ? a.n : 1) * sizeof(*names));
  if (names == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  npu_gguf_arr_values(&a, names);
  for (int32_t i = 0; i < p->n_weights && st == NPULM_OK; i++) {
    if (!npu_gguf_str_eq(names[i].v.s, p->weights[i].name)) {
      st = npu_fail(err, NPULM_ERR_FORMAT,
                    "program weight %d is '%.*s' but the model's weight table has '%s'", i,
                    (int)(names[i].v.s.len < 64 ? names[i].v.s.len : 64), names[i].v.s.ptr,
                    p->weights[i].name);
    }
  }
  free(names);
  return st;
}

/* The npulm.weights.float values (program_file.h), one per name of npulm.weights, each checked
 * (the names are checked against the weight table later, by check_weight_names). */
enum { WEIGHT_ABSENT = 0, WEIGHT_HELD = 1, WEIGHT_INT8_ONLY = 2 };
static npulm_status get_weight_flags(const struct npu_gguf *g, struct npu_gguf_arr *names,
                                     struct npu_gguf_arr *flags, npulm_error *err) {
  npulm_status st;
  if ((st = npu_gguf_get_arr(g, "npulm.weights", NPU_GGUF_STR, names, err)) != NPULM_OK ||
      (st = npu_gguf_get_arr(g, "npulm.weights.float", NPU_GGUF_U8, flags, err)) != NPULM_OK) {
    return st;
  }
  if (flags->n != names->n || names->n > INT32_MAX / 4) {
    return npu_fail(err, NPULM_ERR_FORMAT, "'npulm.weights.float' has %llu values for %llu weights",
                    (unsigned long long)flags->n, (unsigned long long)names->n);
  }
  for (uint64_t i = 0; i < flags->n; i++) {
    if (flags->data[i] > WEIGHT_INT8_ONLY) {
      return npu_fail(err, NPULM_ERR_FORMAT, "'npulm.weights.float' value %llu is %u",
                      (unsigned long long)i, flags->data[i]);
    }
  }
  return NPULM_OK;
}

npulm_status npu_program_file_omitted(const struct npu_gguf *g, char ***names_out, int32_t *n_out,
                                      npulm_error *err) {
  *names_out = NULL;
  *n_out = 0;
  struct npu_gguf_arr names, flags;
  npulm_status st = get_weight_flags(g, &names, &flags, err);
  if (st != NPULM_OK) return st;
  int32_t n = 0;
  for (uint64_t i = 0; i < flags.n; i++) n += flags.data[i] == WEIGHT_INT8_ONLY;
  if (n == 0) return NPULM_OK;
  struct npu_gguf_value *values = malloc((size_t)names.n * sizeof(*values));
  char **out = calloc((size_t)n, sizeof(*out));
  if (values == NULL || out == NULL) {
    free(values);
    free(out);
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  }
  npu_gguf_arr_values(&names, values);
  int32_t k = 0;
  for (uint64_t i = 0; i < names.n && st == NPULM_OK; i++) {
    if (flags.data[i] != WEIGHT_INT8_ONLY) continue;
    struct npu_gguf_str s = values[i].v.s;
    if (s.len >= sizeof(((struct npu_weight *)0)->name) ||
        memchr(s.ptr, '\0', (size_t)s.len) != NULL) {
      st = npu_fail(err, NPULM_ERR_FORMAT, "'npulm.weights': name %llu is invalid",
                    (unsigned long long)i);
    } else if ((out[k] = malloc((size_t)s.len + 1)) == NULL) {
      st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
    } else {
      memcpy(out[k], s.ptr, (size_t)s.len);
      out[k++][s.len] = '\0';
    }
  }
  free(values);
  if (st != NPULM_OK) {
    for (int32_t i = 0; i < k; i++) free(out[i]);
    free(out);
    return st;
  }
  *names_out = out;
  *n_out = k;
  return NPULM_OK;
}

/* Whether the file holds each weight of the table as its npulm.weights.float says: a weight the
 * model lacks has no view, one held a view, one held in int8 only no view (the model was read
 * with npu_program_file_omitted's names: npu_program_verify checks that no node reads it in
 * float). Sets p->keep_float when the file holds every weight the model has. */
static npulm_status check_weight_flags(const struct npu_gguf *g, struct npu_program *p,
                                       npulm_error *err) {
  struct npu_gguf_arr names, flags;
  npulm_status st = get_weight_flags(g, &names, &flags, err);
  if (st != NPULM_OK) return st;
  p->keep_float = true;
  for (int32_t i = 0; i < p->n_weights && (uint64_t)i < flags.n; i++) {
    const uint8_t f = flags.data[i];
    const bool has = p->weights[i].data != NULL;
    if (has != (f == WEIGHT_HELD)) {
      return npu_fail(err, NPULM_ERR_FORMAT,
                      "program weight %d ('%s') is listed as %s but the file %s", i,
                      p->weights[i].name,
                      f == WEIGHT_HELD     ? "held"
                      : f == WEIGHT_ABSENT ? "absent from the model"
                                           : "held in int8 only",
                      has ? "holds it as a float tensor" : "holds no float tensor of it");
    }
    p->keep_float &= f != WEIGHT_INT8_ONLY;
  }
  return NPULM_OK;
}

/* Decode the tensor records and names of graph 'gi' into 'gr'; an empty name is the one the
 * record implies (npu_program_tensor_name, of the weight table of 'p'). */
static npulm_status load_tensors(const struct npu_gguf *g, const struct npu_program *p, int32_t gi,
                                 struct npu_graph *gr, npulm_error *err) {
  char key[96], names_key[96];
  struct npu_gguf_arr rec, names_arr;
  snprintf(key, sizeof(key), "npulm.graph.%d.tensors", gi);
  snprintf(names_key, sizeof(names_key), "npulm.graph.%d.tensor_names", gi);
  npulm_status st;
  if ((st = get_records(g, key, TENSOR_FIELDS, &rec, &gr->n_tensors, err)) != NPULM_OK ||
      (st = npu_gguf_get_arr(g, names_key, NPU_GGUF_STR, &names_arr, err)) != NPULM_OK) {
    return st;
  }
  if (names_arr.n != (uint64_t)gr->n_tensors) {
    return npu_fail(err, NPULM_ERR_FORMAT, "'%s' has %llu names for %d tensors", names_key,
                    (unsigned long long)names_arr.n, gr->n_tensors);
  }
  size_t n = (size_t)(gr->n_tensors ? gr->n_tensors : 1);
  struct npu_gguf_value *names = malloc(n * sizeof(*names));
  gr->tensors = calloc(n, sizeof(*gr->tensors));
  if (names == NULL || gr->tensors == NULL) {
    free(names);
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory loading graph %d", gi);
  }
  npu_gguf_arr_values(&names_arr, names);
  for (int32_t i = 0; i < gr->n_tensors && st == NPULM_OK; i++) {
    int32_t f[TENSOR_FIELDS];
    record_at(&rec, i, TENSOR_FIELDS, f);
    struct npu_ir_tensor *t = &gr->tensors[i];
    struct npu_gguf_str name = names[i].v.s;
    const char *why = NULL;
    float scale = bits_f32(f[TENSOR_SCALE]);
    if (f[TENSOR_KIND] < 0 || f[TENSOR_KIND] > NPU_TK_LOGITS) why = "unknown kind";
    else if (f[TENSOR_DTYPE] < 0 || f[TENSOR_DTYPE] >= NPU_DT_COUNT) why = "unknown dtype";
    else if (f[TENSOR_BACKEND] < 0 || f[TENSOR_BACKEND] >= NPU_BE_COUNT) why = "unknown backend";
    else if (f[TENSOR_KV_IS_VALUE] < 0 || f[TENSOR_KV_IS_VALUE] > 1) why = "invalid kv_is_value";
    else if (f[TENSOR_NE0] <= 0 || f[TENSOR_NE1] <= 0 || f[TENSOR_NE2] <= 0)
      why = "non-positive dimension";
    else if (f[TENSOR_REF] < -1) why = "invalid reference";
    else if (f[TENSOR_LAYER] < -1) why = "invalid layer";
    else if (f[TENSOR_ROLE] < 0 || f[TENSOR_ROLE] >= NPU_ROLE_COUNT) why = "unknown role";
    else if (!(scale > 0) || !isfinite(scale) || f[TENSOR_ZERO_POINT] < -65536 ||
             f[TENSOR_ZERO_POINT] > 65535) {
      why = "invalid quantization parameters";
    } else if (name.len >= NPU_IR_NAME_MAX || memchr(name.ptr, '\0', (size_t)name.len) != NULL) {
      why = "invalid name";
    }
    if (why != NULL) {
      st = npu_fail(err, NPULM_ERR_FORMAT, "program graph %d: tensor record %d: %s", gi, i, why);
      break;
    }
    npu_record_load(TENSOR_TABLE, TENSOR_FIELDS, f, ALL_GROUPS, t);
    memcpy(t->name, name.ptr, (size_t)name.len);
    t->name[name.len] = '\0';
    if (name.len == 0 && !npu_program_tensor_name(p->weights, p->n_weights, t, t->name)) {
      st = npu_fail(err, NPULM_ERR_FORMAT,
                    "program graph %d: tensor record %d: empty name, and its record implies none",
                    gi, i);
    }
  }
  free(names);
  return st;
}

static npulm_status load_nodes(const struct npu_gguf *g, int32_t gi, int32_t n_layers,
                               struct npu_graph *gr, npulm_error *err) {
  char key[96];
  struct npu_gguf_arr rec;
  snprintf(key, sizeof(key), "npulm.graph.%d.nodes", gi);
  npulm_status st = get_records(g, key, NODE_FIELDS, &rec, &gr->n_nodes, err);
  if (st != NPULM_OK) return st;
  gr->nodes = calloc((size_t)(gr->n_nodes ? gr->n_nodes : 1), sizeof(*gr->nodes));
  if (gr->nodes == NULL)
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory loading graph %d", gi);
  for (int32_t i = 0; i < gr->n_nodes; i++) {
    int32_t f[NODE_FIELDS];
    record_at(&rec, i, NODE_FIELDS, f);
    const char *why = NULL;
    if (f[NODE_OP] < 0 || f[NODE_OP] >= NPU_OP_COUNT) why = "unknown op";
    else if (f[NODE_BACKEND] < 0 || f[NODE_BACKEND] >= NPU_BE_COUNT) why = "unknown backend";
    else if (f[NODE_PINNED] < 0 || f[NODE_PINNED] > 1) why = "invalid pinned flag";
    else if (f[NODE_OUT] < 0 || f[NODE_OUT] >= gr->n_tensors) why = "output tensor id out of range";
    else if (f[NODE_LAYER] < -1 || f[NODE_LAYER] >= n_layers) why = "layer out of range";
    else if (!isfinite(bits_f32(f[NODE_PARAM]))) why = "parameter is not finite";
    for (int s = 0; s < NPU_IR_MAX_IN && why == NULL; s++) {
      int32_t in = f[NODE_IN0 + s];
      if (in < -1 || in >= gr->n_tensors) why = "input tensor id out of range";
    }
    if (why != NULL) {
      return npu_fail(err, NPULM_ERR_FORMAT, "program graph %d: node record %d: %s", gi, i, why);
    }
    npu_record_load(NODE_TABLE, NODE_FIELDS, f, ALL_GROUPS, &gr->nodes[i]);
  }
  return NPULM_OK;
}

static npulm_status load_graph(const struct npu_gguf *g, const struct npu_program *p, int32_t gi,
                               int32_t n_layers, struct npu_graph *gr, npulm_error *err) {
  char key[96];
  struct npu_gguf_arr a;
  int32_t n;
  npulm_status st;
  snprintf(key, sizeof(key), "npulm.graph.%d.info", gi);
  if ((st = get_records(g, key, INFO_FIELDS, &a, &n, err)) != NPULM_OK) return st;
  if (n != 1)
    return npu_fail(err, NPULM_ERR_FORMAT, "metadata key '%s' must hold %d values", key,
                    INFO_FIELDS);
  int32_t f[INFO_FIELDS];
  record_at(&a, 0, INFO_FIELDS, f);
  npu_record_load(INFO_TABLE, INFO_FIELDS, f, ALL_GROUPS, gr);
  snprintf(key, sizeof(key), "npulm.graph.%d.arena_size", gi);
  if ((st = npu_gguf_get_arr(g, key, NPU_GGUF_U64, &a, err)) != NPULM_OK) return st;
  if (a.n != NPU_BE_COUNT) {
    return npu_fail(err, NPULM_ERR_FORMAT, "metadata key '%s' must hold %d values", key,
                    NPU_BE_COUNT);
  }
  memcpy(gr->arena_size, a.data, sizeof(gr->arena_size));
  if ((st = load_tensors(g, p, gi, gr, err)) != NPULM_OK ||
      (st = load_nodes(g, gi, n_layers, gr, err)) != NPULM_OK) {
    return st;
  }
  snprintf(key, sizeof(key), "npulm.graph.%d.subgraphs", gi);
  if ((st = get_records(g, key, SUBGRAPH_FIELDS, &a, &gr->n_subgraphs, err)) != NPULM_OK) return st;
  gr->subgraphs = calloc((size_t)(gr->n_subgraphs ? gr->n_subgraphs : 1), sizeof(*gr->subgraphs));
  if (gr->subgraphs == NULL)
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory loading graph %d", gi);
  for (int32_t s = 0; s < gr->n_subgraphs; s++) {
    int32_t r[SUBGRAPH_FIELDS];
    record_at(&a, s, SUBGRAPH_FIELDS, r);
    npu_record_load(SUBGRAPH_TABLE, SUBGRAPH_FIELDS, r, ALL_GROUPS, &gr->subgraphs[s]);
  }
  return NPULM_OK;
}

/* ---- Loading the integer data ----------------------------------------------------------- */

/* A string array under 'key' of exactly 'n' names, each shorter than NPU_IR_NAME_MAX without NUL
 * bytes, copied into 'dst' + i * stride. */
static npulm_status get_names(const struct npu_gguf *g, const char *key, int32_t n, char *dst,
                              size_t stride, npulm_error *err) {
  struct npu_gguf_arr a;
  npulm_status st = npu_gguf_get_arr(g, key, NPU_GGUF_STR, &a, err);
  if (st != NPULM_OK) return st;
  if (a.n != (uint64_t)n) {
    return npu_fail(err, NPULM_ERR_FORMAT, "'%s' has %llu names for %d records", key,
                    (unsigned long long)a.n, n);
  }
  struct npu_gguf_value *names = malloc((size_t)(n ? n : 1) * sizeof(*names));
  if (names == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  npu_gguf_arr_values(&a, names);
  for (int32_t i = 0; i < n && st == NPULM_OK; i++) {
    struct npu_gguf_str name = names[i].v.s;
    if (name.len == 0 || name.len >= NPU_IR_NAME_MAX ||
        memchr(name.ptr, '\0', (size_t)name.len) != NULL) {
      st = npu_fail(err, NPULM_ERR_FORMAT, "'%s': name %d is invalid", key, i);
    } else {
      memcpy(dst + (size_t)i * stride, name.ptr, (size_t)name.len);
      dst[(size_t)i * stride + name.len] = '\0';
    }
  }
  free(names);
  return st;
}

static npulm_status load_qtensors(const struct npu_gguf *g, struct npu_program *p,
                                  npulm_error *err) {
  struct npu_gguf_arr rec;
  int32_t n;
  npulm_status st = get_records(g, "npulm.qtensors", QTENSOR_FIELDS, &rec, &n, err);
  if (st != NPULM_OK) return st;
  p->qtensors = calloc((size_t)(n ? n : 1), sizeof(*p->qtensors));
  if (p->qtensors == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  p->n_qtensors = n;
  if ((st = get_names(g, "npulm.qtensor_names", n, p->qtensors[0].name, sizeof(*p->qtensors),
                      err)) != NPULM_OK) {
    return st;
  }
  for (int32_t i = 0; i < n; i++) {
    int32_t f[QTENSOR_FIELDS];
    record_at(&rec, i, QTENSOR_FIELDS, f);
    int32_t dt = f[QTENSOR_DTYPE];
    if (dt != NPU_DT_I8 && dt != NPU_DT_I16) {
      return npu_fail(err, NPULM_ERR_FORMAT, "program quantization table entry %d: dtype %d", i,
                      dt);
    }
    npu_record_load(QTENSOR_TABLE, QTENSOR_FIELDS, f, ALL_GROUPS, &p->qtensors[i]);
  }
  return NPULM_OK; /* values checked by npu_program_verify */
}

/* Tensor 'npulm.qsite.S.<field>' of ggml 'type' and shape [ne0] (ne1 = 0) or [ne0, ne1]. */
static npulm_status site_tensor(const struct npu_gguf *g, const struct npu_program *p, int32_t si,
                                const char *field, uint32_t type, uint64_t ne0, uint64_t ne1,
                                const struct npu_gguf_tensor **out, npulm_error *err) {
  char name[64];
  snprintf(name, sizeof(name), "npulm.qsite.%d.%s", si, field);
  const struct npu_gguf_tensor *t = npu_gguf_find_tensor(g, name);
  if (t == NULL) return npu_program_site_fail(err, p, si, "tensor '%s' is missing", name);
  if (t->type != type || t->n_dims != (ne1 ? 2u : 1u) || t->ne[0] != ne0 ||
      (ne1 && t->ne[1] != ne1)) {
    char shape[64];
    if (ne1) {
      snprintf(shape, sizeof(shape), "[%llu, %llu]", (unsigned long long)ne0,
               (unsigned long long)ne1);
    } else {
      snprintf(shape, sizeof(shape), "[%llu]", (unsigned long long)ne0);
    }
    return npu_program_site_fail(err, p, si, "tensor '%s' is not %s %s", name,
                                 type == GGML_I8    ? "I8"
                                 : type == GGML_I32 ? "I32"
                                                    : "F32",
                                 shape);
  }
  *out = t;
  return NPULM_OK;
}

/* A heap copy of 'bytes' bytes of tensor 't' (into '*dst'). */
static npulm_status copy_out(const struct npu_gguf_tensor *t, size_t bytes, void **dst,
                             npulm_error *err) {
  *dst = malloc(bytes ? bytes : 1);
  if (*dst == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  memcpy(*dst, t->data, bytes);
  return NPULM_OK;
}

/* Decode site 'si' from its record 'f' and its tensors. Shapes are checked here, so that every
 * array has the size its record claims; values by npu_program_verify. */
static npulm_status load_site(const struct npu_gguf *g, struct npu_program *p, int32_t si,
                              const int32_t *f, npulm_error *err) {
  struct npu_qsite *s = &p->qsites[si];
  int32_t op = f[SITE_OP];
  if (op < 0 || op >= NPU_OP_COUNT || !npu_op_info((enum npu_op)op)->on_npu) {
    return npu_program_site_fail(err, p, si, "op %d has no integer kernel", op);
  }
  /* the fields of the site's op; all others must be 0 */
  uint32_t groups = npu_site_record_groups((enum npu_op)op);
  for (int32_t k = SITE_OP + 1; k < SITE_FIELDS; k++) {
    if (!(SITE_TABLE[k].group & groups) && f[k] != 0) {
      return npu_program_site_fail(err, p, si, "record field %d must be 0 for a %s", k,
                                   npu_op_name((enum npu_op)op));
    }
  }
  npu_record_load(SITE_TABLE, SITE_FIELDS, f, groups, s);
  if (groups & NPU_SITE_RMSNORM) {
    /* its multipliers, one per channel */
    const struct npu_gguf_tensor *t;
    npulm_status st;
    if (s->n < 1 || s->n > NPU_QS16_RMSNORM_MAX_COLS)
      return npu_program_site_fail(err, p, si, "has width %d", s->n);
    if ((st = site_tensor(g, p, si, "mult", GGML_I32, (uint64_t)s->n, 0, &t, err)) != NPULM_OK ||
        (st = copy_out(t, (size_t)s->n * sizeof(int32_t), (void **)&s->mult, err)) != NPULM_OK) {
      return st;
    }
    s->rmsnorm.mult = s->mult;
    return NPULM_OK;
  }
  if (!(groups & NPU_SITE_TABLE)) return NPULM_OK;
  if (s->n < 1 || s->k < 1 || (op == NPU_OP_MATMUL && s->k > NPU_QS8_GEMM_MAX_K)) {
    return npu_program_site_fail(err, p, si, "has an invalid shape [n %d, k %d]", s->n, s->k);
  }
  const struct npu_gguf_tensor *t;
  npulm_status st;
  if (s->table_site < 0) {
    uint64_t packed =
        op == NPU_OP_MATMUL ? npu_matmul_packed_size(s) : (uint64_t)s->n * (uint64_t)s->k;
    if (packed == 0) {
      return npu_program_site_fail(err, p, si, "has weights of %d bits in blocks of %d", s->w_bits,
                                   s->w_block);
    }
    if ((st = site_tensor(g, p, si, "packed", GGML_I8, packed, 0, &t, err)) != NPULM_OK) return st;
    s->packed = (void *)t->data; /* in place: p->qsites_mapped */
    s->packed_size = packed;
  }
  size_t n = (size_t)s->n;
  if ((st = site_tensor(g, p, si, "mult", GGML_I32, n, 0, &t, err)) != NPULM_OK ||
      (st = copy_out(t, n * sizeof(int32_t), (void **)&s->mult, err)) != NPULM_OK ||
      (st = site_tensor(g, p, si, "shift", GGML_I8, n, 0, &t, err)) != NPULM_OK) {
    return st;
  }
  /* the shifts, stored as I8, widened for the kernels (their range: npu_program_verify) */
  if ((s->shift = malloc(n * sizeof(int32_t))) == NULL) {
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  }
  for (size_t c = 0; c < n; c++) s->shift[c] = ((const int8_t *)t->data)[c];
  if (groups & NPU_SITE_GEMM) {
    s->gemm.mult = s->mult;
    s->gemm.shift = s->shift;
    s->gemm16.mult = s->mult;
    s->gemm16.shift = s->shift;
    s->gemm16.y_zero_point = s->gemm.y_zero_point;
    s->gemm16.block = s->w_block;
  } else {
    s->gather.mult = s->mult;
    s->gather.shift = s->shift;
  }
  if (!(groups & NPU_SITE_OUTLIERS) || (s->n_outliers == 0 && s->outlier_dim == 0)) {
    if (s->n_outliers != 0 || s->outlier_dim != 0) {
      return npu_program_site_fail(err, p, si, "has shadow outliers but is not a matmul");
    }
    return NPULM_OK;
  }
  if (s->n_outliers < 1 || s->n_outliers > s->k || s->outlier_dim < 0) {
    return npu_program_site_fail(err, p, si, "has %d outlier channels of %d (dim %d)",
                                 s->n_outliers, s->k, s->outlier_dim);
  }
  size_t no = (size_t)s->n_outliers, dim = (size_t)s->outlier_dim;
  if ((st = site_tensor(g, p, si, "outliers", GGML_I32, no, 0, &t, err)) != NPULM_OK ||
      (st = copy_out(t, no * sizeof(int32_t), (void **)&s->outliers, err)) != NPULM_OK ||
      (st = site_tensor(g, p, si, "outlier_w", NPU_GGML_F32, no, n, &t, err)) != NPULM_OK ||
      (st = copy_out(t, no * n * sizeof(float), (void **)&s->outlier_w, err)) != NPULM_OK) {
    return st;
  }
  if (dim == 0) return NPULM_OK;
  if ((st = site_tensor(g, p, si, "outlier_gate", NPU_GGML_F32, dim, no, &t, err)) != NPULM_OK ||
      (st = copy_out(t, no * dim * sizeof(float), (void **)&s->outlier_gate, err)) != NPULM_OK ||
      (st = site_tensor(g, p, si, "outlier_up", NPU_GGML_F32, dim, no, &t, err)) != NPULM_OK ||
      (st = copy_out(t, no * dim * sizeof(float), (void **)&s->outlier_up, err)) != NPULM_OK) {
    return st;
  }
  return NPULM_OK;
}

static npulm_status load_sites(const struct npu_gguf *g, struct npu_program *p, bool place,
                               npulm_error *err) {
  struct npu_gguf_arr rec, luts, luts16;
  int32_t n;
  npulm_status st = get_records(g, "npulm.qsites", SITE_FIELDS, &rec, &n, err);
  if (st != NPULM_OK) return st;
  p->qsites = calloc((size_t)(n ? n : 1), sizeof(*p->qsites));
  if (p->qsites == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  p->n_qsites = n;
  p->qsites_mapped = true; /* from here on, 'packed' may point into the mapping */
  if ((st = get_names(g, "npulm.qsite_names", n, p->qsites[0].name, sizeof(*p->qsites), err)) !=
      NPULM_OK) {
    return st;
  }
  /* sites of an op with a LUT (SILU; load_site refuses any other op): int8 or int16 tables */
  int32_t n_luts = 0, n_luts16 = 0;
  for (int32_t i = 0; i < n; i++) {
    int32_t op = arr_i32(&rec, (uint64_t)i * SITE_FIELDS + SITE_OP);
    if (op < 0 || op >= NPU_OP_COUNT || !(npu_op_info((enum npu_op)op)->sites & NPU_SITE_LUT)) {
      continue;
    }
    if (arr_i32(&rec, (uint64_t)i * SITE_FIELDS + SITE_LUT_WIDE) != 0) n_luts16++;
    else n_luts++;
  }
  if ((st = npu_gguf_get_arr(g, "npulm.qsites.luts", NPU_GGUF_I8, &luts, err)) != NPULM_OK ||
      (st = npu_gguf_get_arr(g, "npulm.qsites.luts16", NPU_GGUF_I16, &luts16, err)) != NPULM_OK) {
    return st;
  }
  if (luts.n != (uint64_t)n_luts * LUT_SIZE || luts16.n != (uint64_t)n_luts16 * LUT16_SIZE) {
    return npu_fail(err, NPULM_ERR_FORMAT,
                    "'npulm.qsites.luts' and '.luts16' have %llu and %llu values for %d and %d "
                    "SILU sites of %d and %d each",
                    (unsigned long long)luts.n, (unsigned long long)luts16.n, n_luts, n_luts16,
                    LUT_SIZE, LUT16_SIZE);
  }
  /* which gathers read their table out of a matmul's packed weights (absent: none) */
  for (int32_t i = 0; i < n; i++) p->qsites[i].table_site = -1;
  if (npu_gguf_find(g, "npulm.qsites.tables") != NULL) {
    struct npu_gguf_arr tables;
    if ((st = npu_gguf_get_arr(g, "npulm.qsites.tables", NPU_GGUF_I32, &tables, err)) != NPULM_OK) {
      return st;
    }
    if (tables.n != (uint64_t)n) {
      return npu_fail(err, NPULM_ERR_FORMAT, "'npulm.qsites.tables' has %llu values for %d sites",
                      (unsigned long long)tables.n, n);
    }
    for (int32_t i = 0; i < n; i++) {
      int32_t owner = arr_i32(&tables, (uint64_t)i);
      if (owner < -1 || owner >= n || owner == i) {
        return npu_fail(err, NPULM_ERR_FORMAT, "program site %d reads its table from site %d", i,
                        owner);
      }
      p->qsites[i].table_site = owner;
    }
  }
  for (int32_t i = 0, lut = 0, lut16 = 0; i < n; i++) {
    int32_t f[SITE_FIELDS];
    record_at(&rec, i, SITE_FIELDS, f);
    if ((st = load_site(g, p, i, f, err)) != NPULM_OK) return st;
    struct npu_qsite *s = &p->qsites[i];
    if (!(npu_op_info((enum npu_op)s->op)->sites & NPU_SITE_LUT)) continue;
    if (s->lut_wide) {
      memcpy(s->lut16, (const uint8_t *)luts16.data + (size_t)lut16++ * sizeof(s->lut16),
             sizeof(s->lut16));
    } else {
      memcpy(s->lut, luts.data + (size_t)lut++ * LUT_SIZE, LUT_SIZE);
    }
  }
  /* borrowed tables point at their matmul's packed weights (npu_program_verify checks the pair) */
  for (int32_t i = 0; i < n; i++) {
    struct npu_qsite *s = &p->qsites[i];
    if (s->table_site < 0) continue;
    s->packed = p->qsites[s->table_site].packed;
    s->packed_size = p->qsites[s->table_site].packed_size;
  }
  /* out of the mapping into huge pages, before npu_program_verify reads them: what is checked is
   * what runs; under a memory budget they stay in the file (the sessions read them as needed) */
  return place ? npu_quant_place_packed(p, err) : NPULM_OK;
}

/* The integer half of a program file: mode and options, the quantization table, the sites; then
 * the kernels for this CPU, and every graph's link to its sites. */
static npulm_status load_quant(const struct npu_gguf *g, struct npu_program *p, bool place,
                               npulm_error *err) {
  uint32_t mode;
  npulm_status st = npu_gguf_get_u32(g, "npulm.quant.mode", &mode, err);
  if (st != NPULM_OK) return st;
  if (mode >= NPU_QUANT_MODE_COUNT) {
    return npu_fail(err, NPULM_ERR_FORMAT, "program quantization mode %u is unknown", mode);
  }
  p->quant_mode = (int32_t)mode;
  if (mode == NPU_QUANT_F32) return NPULM_OK;
  if ((st = npu_gguf_get_f32(g, "npulm.quant.smooth_alpha", &p->smooth_alpha, err)) != NPULM_OK ||
      (st = npu_gguf_get_f32(g, "npulm.quant.shadow_threshold", &p->shadow_threshold, err)) !=
          NPULM_OK ||
      (st = load_qtensors(g, p, err)) != NPULM_OK ||
      (st = load_sites(g, p, place, err)) != NPULM_OK) {
    return st;
  }
  npu_ukernels_select(npu_isa_detect(), &p->uk);
  for (int32_t i = 0; i < p->n_graphs; i++) {
    npulm_error inner;
    if ((st = npu_quant_link(p, &p->graphs[i], &inner)) != NPULM_OK) {
      return npu_fail(err, st, "program graph %d: %s", i, inner.msg);
    }
  }
  return NPULM_OK;
}

/* Under a memory budget the weights stay in the file: once checked, their pages are let go of
 * (npu_site_checked_fn; 'user' is the file), so that the checks do not leave the whole file
 * resident. */
static void drop_checked(void *user, const struct npu_program *p, int32_t site) {
  const struct npu_gguf *g = user;
  const uint8_t *w = p->qsites[site].packed;
  if (g->stream && w != NULL && w >= g->base && w < g->base + g->size) {
    const uint64_t at = (uint64_t)(w - g->base);
    npu_gguf_drop(g, at, at + p->qsites[site].packed_size, false);
  }
}

npulm_status npu_program_load(const struct npulm_model *m, struct npu_program **out,
                              npulm_error *err) {
  *out = NULL;
  const struct npu_gguf *g = m->gguf;
  bool is_program;
  npulm_status st = npu_program_file_check(g, &is_program, err);
  if (st != NPULM_OK) return st;
  if (!is_program)
    return npu_fail(err, NPULM_ERR_FORMAT, "missing metadata key '%s'", NPU_PROGRAM_KEY_VERSION);
  struct npu_program *p = calloc(1, sizeof(*p));
  if (p == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  npulm_error inner;
  if ((st = load_options(g, &p->opts, err)) != NPULM_OK) goto fail;
  if (npu_compile_check_options(&m->cfg, &p->opts, &inner) != NPULM_OK) {
    st = npu_program_fail_prefixed(err, NPULM_ERR_FORMAT, "program compile options", &inner);
    goto fail;
  }
  if ((st = npu_weight_table(m, &p->weights, &p->n_weights, err)) != NPULM_OK ||
      (st = check_weight_names(g, p, err)) != NPULM_OK ||
      (st = check_weight_flags(g, p, err)) != NPULM_OK) {
    goto fail;
  }
  uint32_t count;
  if ((st = npu_gguf_get_u32(g, "npulm.graph.count", &count, err)) != NPULM_OK) goto fail;
  int32_t want = npu_program_graph_shapes(&p->opts, true, NULL, NULL, NULL);
  if (count != (uint32_t)want) want = npu_program_graph_shapes(&p->opts, false, NULL, NULL, NULL);
  if (count != (uint32_t)want) {
    st = npu_fail(err, NPULM_ERR_FORMAT, "program has %u graphs but its options make %d", count,
                  npu_program_graph_shapes(&p->opts, true, NULL, NULL, NULL));
    goto fail;
  }
  p->graphs = calloc((size_t)(want ? want : 1), sizeof(*p->graphs));
  if (p->graphs == NULL) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
    goto fail;
  }
  for (int32_t i = 0; i < want; i++) {
    p->n_graphs++; /* freed with the program, even if half loaded */
    if ((st = load_graph(g, p, i, m->cfg.n_layers, &p->graphs[i], err)) != NPULM_OK) goto fail;
  }
  if ((st = load_quant(g, p, m->mem_budget == 0, err)) != NPULM_OK) goto fail;
  if ((st = npu_program_load_sparse(g, &m->cfg, m->mem_budget == 0, p, err)) != NPULM_OK) goto fail;
  if (m->mem_budget > 0 && p->sparse != NULL) {
    /* under a budget: hold what fits in memory, leave the rest in the file */
    p->streamed = calloc((size_t)p->n_qsites + 1, 1);
    if (p->streamed == NULL) {
      st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
      goto fail;
    }
    p->held_bytes = npu_sparse_streamed(p, m->mem_budget, p->streamed);
    if ((st = npu_quant_place_packed_but(p, p->streamed, err)) != NPULM_OK ||
        (st = npu_sparse_place(p->sparse, false, err)) != NPULM_OK) {
      goto fail;
    }
  }
  if ((st = npu_program_verify_each_site(m, p, drop_checked, (void *)g, err)) != NPULM_OK)
    goto fail;
  program_sizes(m, p);
  *out = p;
  return NPULM_OK;
fail:
  npu_program_free(p);
  return st;
}
