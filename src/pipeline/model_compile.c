/* The compilation half of the public API: compile a model into static graphs, save it as a
 * program file. (Opening a program file is npulm_model_open; describing one is in inspect.c.) */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/atomic_file.h"
#include "base/common.h"
#include "compiler/compiler.h"
#include "compiler/quantize.h"
#include "compiler/smooth.h"
#include "compiler/sparsify.h"
#include "io/gguf.h"
#include "io/gguf_checksum.h"
#include "model/model.h"
#include "pipeline/open.h"
#include "pipeline/sparse_calibrate.h"
#include "program/program_io.h"

#define DEFAULT_CALIB_TOKENS 1024

_Static_assert(NPULM_MAX_CHUNKS == NPU_MAX_CHUNKS && NPULM_MAX_BUCKETS == NPU_MAX_BUCKETS,
               "public and internal limits must agree");

npulm_compile_params npulm_compile_default_params(void) {
  npulm_compile_params p;
  memset(&p, 0, sizeof(p));
  return p;
}

/* The compiler's options for 'params' (NULL: the defaults). Default chunk sizes larger than the
 * largest bucket are dropped (a model with a short context); chunk sizes given are kept as given,
 * so that npu_compile_check_options reports them. */
static npulm_status options_from_params(const struct npu_config *cfg,
                                        const npulm_compile_params *params,
                                        struct npu_compile_options *o, npulm_error *err) {
  npulm_compile_params defaults = npulm_compile_default_params();
  npu_compile_default_options(cfg, o);
  if (params == NULL) params = &defaults;
  if (params->n_chunks < 0 || params->n_chunks > NPULM_MAX_CHUNKS) {
    return npu_fail(err, NPULM_ERR_ARG, "%d chunk sizes: between 0 (the defaults) and %d allowed",
                    params->n_chunks, NPULM_MAX_CHUNKS);
  }
  if (params->n_buckets < 0 || params->n_buckets > NPULM_MAX_BUCKETS) {
    return npu_fail(err, NPULM_ERR_ARG,
                    "%d context buckets: between 0 (the defaults) and %d allowed",
                    params->n_buckets, NPULM_MAX_BUCKETS);
  }
  if (params->n_buckets > 0) {
    memset(o->buckets, 0, sizeof(o->buckets));
    o->n_buckets = params->n_buckets;
    for (int i = 0; i < params->n_buckets; i++) o->buckets[i] = params->buckets[i];
  }
  if (params->n_chunks > 0) {
    memset(o->chunks, 0, sizeof(o->chunks));
    o->n_chunks = params->n_chunks;
    for (int i = 0; i < params->n_chunks; i++) o->chunks[i] = params->chunks[i];
  } else {
    int32_t max_ctx = o->buckets[o->n_buckets - 1];
    while (o->n_chunks > 0 && o->chunks[o->n_chunks - 1] > max_ctx) o->chunks[--o->n_chunks] = 0;
  }
  return NPULM_OK;
}

/* The precision policy of a comma list such as "softmax,qk" (NULL: the default). */
static npulm_status parse_float_ops(const char *list, uint32_t *mask, npulm_error *err) {
  if (list == NULL) {
    *mask = NPU_DEFAULT_FLOAT_OPS;
    return NPULM_OK;
  }
  *mask = 0;
  if (strcmp(list, "none") == 0) return NPULM_OK;
  const char *s = list;
  while (*s != '\0') {
    size_t len = strcspn(s, ",");
    static const struct {
      const char *name;
      enum npu_op op;
    } ops[] = {{"softmax", NPU_OP_SOFTMAX},
               {"qk", NPU_OP_QK},
               {"pv", NPU_OP_PV},
               {"rmsnorm", NPU_OP_RMSNORM}};
    bool found = false;
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
      if (strlen(ops[i].name) == len && strncmp(s, ops[i].name, len) == 0) {
        *mask |= 1u << ops[i].op;
        found = true;
      }
    }
    if (!found && len > 0) {
      return npu_fail(err, NPULM_ERR_ARG,
                      "unknown float op '%.*s' (softmax, qk, pv, rmsnorm, none)", (int)len, s);
    }
    s += len + (s[len] == ',');
  }
  return NPULM_OK;
}

static npulm_status quant_from_params(const npulm_compile_params *params,
                                      struct npu_quant_options *q, npulm_error *err) {
  npu_quant_default_options(q);
  const char *name = params != NULL && params->quant != NULL ? params->quant : NULL;
  if (name != NULL) {
    const int mode = npu_quant_mode_parse(name);
    if (mode < 0) {
      return npu_fail(err, NPULM_ERR_ARG,
                      "unknown quantization '%s' (a precision w8a8, w8a16, w4a16, w4a16-block or "
                      "w4a8, alone or with -naive, -shadow or -smooth; or f32)",
                      name);
    }
    q->mode = (enum npu_quant_mode)mode;
  }
  if (params != NULL) q->n_threads = params->n_threads;
  if (params != NULL && params->smooth_alpha != 0.0f) q->smooth_alpha = params->smooth_alpha;
  if (params != NULL && params->shadow_threshold != 0.0f) {
    q->shadow_threshold = params->shadow_threshold;
  }
  /* (a program file refuses options that are not finite, so compiling does too) */
  /* NPULM_SMOOTH_ALPHA_AUTO is NPU_SMOOTH_AUTO (tests/test_smooth.c) */
  if (!(q->smooth_alpha == NPU_SMOOTH_AUTO || (q->smooth_alpha > 0.0f && q->smooth_alpha < 1.0f)) ||
      !(q->shadow_threshold > 1.0f) || !isfinite(q->shadow_threshold)) {
    return npu_fail(err, NPULM_ERR_ARG,
                    "smooth alpha must be in (0, 1) (or auto) and the shadow threshold finite and "
                    "above 1");
  }
  return NPULM_OK;
}

/* Calibrate on the given (or built-in) text and quantize 'p' in place. */
static npulm_status quantize(const struct npulm_model *m, struct npu_program *p,
                             const npulm_compile_params *params, const struct npu_quant_options *q,
                             npulm_error *err) {
  const char *text = npu_calib_default_text;
  size_t len = strlen(npu_calib_default_text);
  if (params != NULL && params->calib_text != NULL) {
    text = params->calib_text;
    len = params->calib_len;
  }
  int limit =
      params != NULL && params->calib_tokens > 0 ? params->calib_tokens : DEFAULT_CALIB_TOKENS;
  size_t n = 0;
  int32_t *ids = NULL;
  npulm_status st = npu_tokenize_alloc(m, text, len, false, &ids, &n, err);
  if (st == NPULM_OK && n == 0) {
    st = npu_fail(err, NPULM_ERR_ARG, "the calibration text is empty");
  }
  if (st == NPULM_OK) {
    if (n > (size_t)limit) n = (size_t)limit;
    npulm_model_info info;
    npulm_model_get_info(m, &info);
    st = npu_quantize_program(m, p, ids, n, info.add_bos ? info.bos_id : -1, q,
                              params != NULL ? params->progress : NULL,
                              params != NULL ? params->progress_user : NULL, err);
    const float level = params != NULL ? params->sparsity : 0.0f;
    if (st == NPULM_OK && params != NULL && params->sparse_form != NPULM_SPARSE_FORM_INPUT &&
        params->sparse_form != NPULM_SPARSE_FORM_NEURON) {
      st = npu_fail(err, NPULM_ERR_ARG, "unknown sparse form %d", params->sparse_form);
    }
    if (st == NPULM_OK && level != 0.0f && q->mode == NPU_QUANT_F32) {
      st = npu_fail(err, NPULM_ERR_ARG, "sparse decode needs an integer program, not f32");
    }
    const int32_t bos = info.add_bos ? info.bos_id : -1;
    if (st == NPULM_OK && level != 0.0f && params->sparse_form == NPULM_SPARSE_FORM_NEURON) {
      st = npu_sparse_calibrate(m, p, level, params->sparse_rank, ids, n, bos, params, err);
    } else if (st == NPULM_OK && level != 0.0f) {
      st = npu_input_calibrate(m, p, level, ids, n, bos, params, err);
    }
  }
  free(ids);
  return st;
}

npulm_status npu_program_build(const struct npulm_model *model, const npulm_compile_params *params,
                               const char *spill_dir, struct npu_program **out, npulm_error *err) {
  struct npu_compile_options o;
  struct npu_quant_options q;
  struct npu_program *p = NULL;
  *out = NULL;
  npulm_status st = options_from_params(&model->cfg, params, &o, err);
  if (st == NPULM_OK)
    st = parse_float_ops(params != NULL ? params->float_ops : NULL, &o.float_ops, err);
  if (st == NPULM_OK) st = quant_from_params(params, &q, err);
  q.spill_dir = spill_dir;
  if (st == NPULM_OK) o.float_ops = npu_quant_float_ops(q.mode, o.float_ops);
  if (st == NPULM_OK)
    st = npu_compile(model, &o, params != NULL ? params->progress : NULL,
                     params != NULL ? params->progress_user : NULL, &p, err);
  if (st == NPULM_OK) st = quantize(model, p, params, &q, err);
  if (st != NPULM_OK) {
    npu_program_free(p);
    return st;
  }
  p->keep_float = p->quant_mode == NPU_QUANT_F32 || (params != NULL && params->keep_float);
  *out = p;
  return NPULM_OK;
}

npulm_status npulm_model_compile(npulm_model *model, const npulm_compile_params *params,
                                 npulm_error *err) {
  struct npu_program *p;
  npulm_status st = npu_program_build(model, params, NULL, &p, err);
  /* to run from memory: the sparse data in huge pages, as the dense weights */
  if (st == NPULM_OK && p->sparse != NULL &&
      (st = npu_sparse_place(p->sparse, true, err)) != NPULM_OK) {
    npu_program_free(p);
  }
  if (st != NPULM_OK) return st; /* the model keeps the program it had */
  npu_program_free(model->program);
  model->program = p;
  return NPULM_OK;
}

bool npulm_model_has_program(const npulm_model *model) { return model->program != NULL; }

npulm_status npulm_model_save_program(const npulm_model *model, const char *path,
                                      void (*progress)(void *user, uint64_t done, uint64_t total),
                                      void *user, npulm_error *err) {
  if (model->program == NULL) {
    return npu_fail(err, NPULM_ERR_ARG, "the model has no program to save: compile it first");
  }
  return npu_program_save(model, model->program, path, progress, user, err);
}

/* npulm_model_save_program's progress as the phase "write" of npulm_compile_file's. */
struct write_progress {
  const npulm_compile_params *params;
};

static void write_progress(void *user, uint64_t done, uint64_t total) {
  const struct write_progress *w = user;
  w->params->progress(w->params->progress_user, "write", "bytes", done, total);
}

/* The directory of file 'path' into 'dir' ("." for a bare name). */
static void directory_of(const char *path, char *dir, size_t cap) {
  const char *slash = strrchr(path, '/');
  if (slash == NULL) snprintf(dir, cap, ".");
  else if (slash == path) snprintf(dir, cap, "/");
  else snprintf(dir, cap, "%.*s", (int)(slash - path), path);
}

npulm_status npulm_check_output(const char *model_path, const char *out_path, npulm_error *err) {
  return npu_afile_check_target(out_path, model_path, err);
}

npulm_status npulm_compile_file(const char *model_path, const char *out_path,
                                const npulm_compile_params *params, npulm_error *err) {
  /* an integer program without its float copy streams; the mode as the compile will parse it */
  struct npu_quant_options q;
  npulm_status st = quant_from_params(params, &q, err);
  if (st != NPULM_OK) return st;
  const bool stream = q.mode != NPU_QUANT_F32 && (params == NULL || !params->keep_float);
  /* a program that cannot be written is said before the compile, not after */
  if ((st = npulm_check_output(model_path, out_path, err)) != NPULM_OK) return st;
  char dir[4096];
  directory_of(out_path, dir, sizeof(dir));
  npulm_model *m = NULL;
  struct npu_program *p = NULL;
  const bool report = params != NULL && params->progress != NULL;
  if (report) params->progress(params->progress_user, "load", "model", 0, 1);
  st = npu_model_open(model_path, stream, NULL, &m, err);
  if (st == NPULM_OK && report) params->progress(params->progress_user, "load", "model", 1, 1);
  if (st == NPULM_OK) st = npu_program_build(m, params, m->defer_matrices ? dir : NULL, &p, err);
  if (st == NPULM_OK) {
    npu_program_free(m->program); /* a program file's own */
    m->program = p;
    struct write_progress wp = {params};
    st = npu_program_save(m, p, out_path, report ? write_progress : NULL, &wp, err);
  }
  npulm_model_close(m);
  return st;
}

/* Print one damaged part of a program file (npu_damage_fn). */
static void print_damage(void *user, const char *what, uint64_t begin, uint64_t end) {
  fprintf((FILE *)user, "damaged: %s, bytes %llu-%llu: its checksum does not match\n", what,
          (unsigned long long)begin, (unsigned long long)end);
}

npulm_status npulm_program_verify_file(const char *path, FILE *out, npulm_error *err) {
  struct npu_gguf *g = NULL;
  int64_t n_damaged = 0;
  npulm_status st = npu_gguf_open(path, &g, err);
  if (st == NPULM_OK) st = npu_program_file_damage(g, print_damage, out, &n_damaged, err);
  const uint64_t n_parts = g != NULL ? g->n_tensors + 1 : 0;
  const uint64_t n_bytes = g != NULL ? (uint64_t)g->size : 0;
  npu_gguf_close(g);
  if (st != NPULM_OK) return st;
  if (n_damaged > 0) {
    fprintf(out, "%s: %lld of %llu parts damaged\n", path, (long long)n_damaged,
            (unsigned long long)n_parts);
    return npu_fail(err, NPULM_ERR_FORMAT,
                    "'%s' is damaged: %lld of its %llu parts fail their "
                    "checksums",
                    path, (long long)n_damaged, (unsigned long long)n_parts);
  }
  /* the bytes are as written: now everything a load checks */
  npulm_model *m = NULL;
  if ((st = npulm_model_open(path, &m, err)) != NPULM_OK) return st;
  fprintf(out,
          "%s: sound: %llu bytes in %llu parts (the header and %llu tensors) match their %s "
          "checksums; %d graphs, their quantization and memory plan verified\n",
          path, (unsigned long long)n_bytes, (unsigned long long)n_parts,
          (unsigned long long)(n_parts - 1), NPU_GGUF_CHECKSUM_NAME, m->program->n_graphs);
  npulm_model_close(m);
  return NPULM_OK;
}
