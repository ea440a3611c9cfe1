/* Opening a model file in the public API: a GGUF model, or a program file (a GGUF with the
 * compiled graphs added), whose program is loaded with it; and opening a session on a model,
 * which for a GGUF model compiles the default FP32 program first. */
#include <stdlib.h>

#include "base/common.h"
#include "compiler/compiler.h"
#include "io/gguf.h"
#include "model/model.h"
#include "pipeline/open.h"
#include "program/program.h"
#include "program/program_io.h"
#include "program/sparse_data.h"
#include "runtime/session_internal.h"

/* A file without tensors (llama.cpp's vocabulary files are such) has nothing to run. */
static npulm_status check_has_tensors(const struct npu_gguf *g, npulm_error *err) {
  if (g->n_tensors > 0) return NPULM_OK;
  return npu_fail(err, NPULM_ERR_FORMAT,
                  "the file has no tensors: a vocabulary only, with no weights to run");
}

npulm_status npulm_model_open(const char *path, npulm_model **model_out, npulm_error *err) {
  return npu_model_open(path, false, NULL, model_out, err);
}

npulm_status npulm_model_open_params(const char *path, const npulm_open_params *params,
                                     npulm_model **model_out, npulm_error *err) {
  return npu_model_open(path, false, params, model_out, err);
}

npulm_status npu_model_open(const char *path, bool defer_matrices, const npulm_open_params *params,
                            npulm_model **model_out, npulm_error *err) {
  *model_out = NULL;
  struct npulm_model *m = calloc(1, sizeof(*m));
  if (m == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  npulm_status st;
  bool is_program = false;
  m->mem_budget = params != NULL ? params->mem_budget : 0;
  m->buffered_io = params != NULL && params->buffered_io;
  const bool cold = params != NULL && params->cold;
  /* a program file (one with npulm.program.version) is a GGUF with the compiled graphs added:
   * its version is checked first, so that a newer file says so instead of failing further on,
   * then its checksums, so that nothing of a damaged one is used */
  if ((st = npu_gguf_open(path, &m->gguf, err)) || (st = check_has_tensors(m->gguf, err))) {
    goto fail;
  }
  if (cold) npu_gguf_drop(m->gguf, 0, m->gguf->size, true);
  m->gguf->stream = m->mem_budget > 0;
  if ((st = npu_program_file_check(m->gguf, &is_program, err))) goto fail;
  if (m->mem_budget > 0 && !is_program) {
    st = npu_fail(err, NPULM_ERR_ARG,
                  "a memory budget needs a program file compiled with --sparsity (npulm compile "
                  "-m '%s' --sparsity S -o FILE.npu), not a GGUF model",
                  path);
    goto fail;
  }
  m->weights_vouched = is_program;
  /* a lean program file holds no float copy of the matrices only the integer NPU reads */
  if (is_program && (st = npu_program_file_omitted(m->gguf, &m->omitted, &m->n_omitted, err))) {
    goto fail;
  }
  m->defer_matrices = defer_matrices && !is_program;
  if ((st = npu_model_read(m, err)) ||
      (is_program && (st = npu_program_load(m, &m->program, err)))) {
    goto fail;
  }
  if (m->mem_budget > 0) {
    if (m->program->sparse == NULL) {
      st = npu_fail(err, NPULM_ERR_ARG,
                    "a memory budget needs a program compiled with --sparsity --sparse-form "
                    "neuron; '%s' has %s",
                    path, npu_program_input_sparse(m->program) ? "the input form" : "none");
      goto fail;
    }
    /* loading read the header and the weights' headers to check them: let them go (what is
     * still read of the header, the vocabulary, comes back a page at a time) */
    npu_gguf_drop(m->gguf, 0, m->gguf->size, cold);
  }
  *model_out = m;
  return NPULM_OK;
fail:
  npulm_model_close(m);
  return st;
}

npulm_status npulm_model_open_vocab(const char *path, npulm_model **model_out, npulm_error *err) {
  *model_out = NULL;
  struct npulm_model *m = calloc(1, sizeof(*m));
  if (m == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  npulm_status st;
  if ((st = npu_gguf_open(path, &m->gguf, err)) || (st = npu_model_read_vocab(m, err))) {
    npulm_model_close(m);
    return st;
  }
  *model_out = m;
  return NPULM_OK;
}

void npulm_model_close(npulm_model *m) {
  if (m == NULL) return;
  npu_program_free(m->program);
  npu_model_release(m);
  free(m);
}

npulm_status npulm_session_create(const npulm_model *model, const npulm_session_params *params,
                                  npulm_session **session_out, npulm_error *err) {
  if ((params != NULL && params->reference) || model->program != NULL) {
    return npu_session_create_program(model, NULL, params, session_out, err);
  }
  /* a model read from a GGUF runs the static graphs of the default options, in FP32: compiled
   * once the parameters are known to be good */
  *session_out = NULL;
  npulm_status st = npu_session_check_params(model, params, err);
  if (st != NPULM_OK) return st;
  struct npu_compile_options o;
  npu_compile_default_options(&model->cfg, &o);
  struct npu_program *prog = NULL;
  if ((st = npu_compile(model, &o, NULL, NULL, &prog, err)) != NPULM_OK) return st;
  return npu_session_create_owning(model, prog, params, session_out, err);
}
