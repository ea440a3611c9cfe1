/* libFuzzer harness for the GGUF reader: parse the input as a GGUF image, then read every value,
 * every array element and every tensor it claims, so the sanitizers see any read the parser's
 * checks let through. Build: `make fuzz`; run: `build-fuzz/fuzz_gguf corpus/` (see README.md). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

/* Values are decoded into a bounded scratch; nested arrays are walked to their bottom. */
#define MAX_ARRAY_VALUES 65536
#define MAX_TENSOR_ELEMS (1u << 24)

static volatile double sink; /* keeps the reads from being optimized away */

static void touch_array(const struct npu_gguf_arr *a, int depth) {
  if (a->n > MAX_ARRAY_VALUES || depth > 16) return;
  struct npu_gguf_value *vals = calloc(a->n ? (size_t)a->n : 1, sizeof(*vals));
  if (vals == NULL) return;
  npu_gguf_arr_values(a, vals);
  for (uint64_t i = 0; i < a->n; i++) {
    if (a->type == NPU_GGUF_ARR) {
      touch_array(&vals[i].v.a, depth + 1);
    } else if (a->type == NPU_GGUF_STR) {
      if (vals[i].v.s.len > 0) sink += (unsigned char)vals[i].v.s.ptr[vals[i].v.s.len - 1];
    } else {
      sink += npu_gguf_arr_num(a, i);
    }
  }
  free(vals);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct npu_gguf *g = NULL;
  npulm_error err;
  if (npu_gguf_open_memory(data, size, &g, &err) != NPULM_OK) {
    if (g != NULL || err.msg[0] == '\0') abort(); /* a failure must name itself and own nothing */
    return 0;
  }
  for (uint64_t i = 0; i < g->n_kv; i++) {
    const struct npu_gguf_kv *kv = &g->kv[i];
    if (kv->key.len > 0) sink += (unsigned char)kv->key.ptr[kv->key.len - 1];
    if (kv->val.type == NPU_GGUF_ARR) touch_array(&kv->val.v.a, 0);
    if (kv->val.type == NPU_GGUF_STR && kv->val.v.s.len > 0) {
      sink += (unsigned char)kv->val.v.s.ptr[kv->val.v.s.len - 1];
    }
  }
  /* The typed getters on the keys a model loader asks for. */
  static const char *const keys[] = {"general.architecture",   "general.alignment",
                                     "llama.embedding_length", "llama.rope.freq_base",
                                     "tokenizer.ggml.tokens",  "tokenizer.ggml.add_bos_token"};
  for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
    uint32_t u;
    float f;
    bool b;
    struct npu_gguf_str s;
    struct npu_gguf_arr a;
    (void)npu_gguf_get_u32(g, keys[k], &u, &err);
    (void)npu_gguf_get_f32(g, keys[k], &f, &err);
    (void)npu_gguf_get_bool(g, keys[k], &b, &err);
    (void)npu_gguf_get_str(g, keys[k], &s, &err);
    (void)npu_gguf_get_arr(g, keys[k], -1, &a, &err);
  }
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    const struct npu_gguf_tensor *t = &g->tensors[i];
    if (npu_gguf_find_tensor(g, "token_embd.weight") != NULL) sink += 1;
    (void)npu_ggml_type_name(t->type);
    if (t->n_elems > MAX_TENSOR_ELEMS) continue;
    float *dst = malloc((size_t)t->n_elems * sizeof(float));
    if (dst == NULL) continue;
    err.msg[0] = '\0';
    if (npu_gguf_tensor_to_f32(t, dst, &err) == NPULM_OK) {
      sink += dst[0] + dst[t->n_elems - 1];
    } else if (err.msg[0] == '\0') {
      abort();
    }
    free(dst);
  }
  npu_gguf_close(g);
  return 0;
}
