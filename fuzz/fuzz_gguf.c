/* libFuzzer harness for the GGUF reader: parse the input as a GGUF image, then read every value,
 * every array element and every tensor it claims, so the sanitizers see any read the parser's
 * checks let through. Build: `make fuzz` (the harness, and its seeds in build-fuzz/seeds/gguf/).
 * Seeds: `NPULM_FUZZ_SEEDS=DIR build-fuzz/fuzz_gguf` writes small files made with the writer into
 * DIR and exits; then `build-fuzz/fuzz_gguf CORPUS DIR -max_len=4096` (see README.md). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/gguf.h"
#include "io/gguf_write.h"

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

/* ---- Seeds: small files from the writer, each under 4 KiB ---------------------------------- */

enum seed_kind { S_EMPTY, S_KEYS, S_TENSORS, S_V2, S_ALIGN1, S_ALIGN64, S_NESTED, S_BLOCKS };

_Noreturn static void die(const char *what, const npulm_error *err) {
  fprintf(stderr, "fuzz_gguf seeds: %s: %s\n", what, err != NULL ? err->msg : "failed");
  exit(1);
}

/* Metadata of every value type, the keys the harness's getters ask for among them. */
static void add_keys(struct npu_gguf_writer *w) {
  static const char *const tokens[] = {"<unk>", "<s>", "</s>", "a", "\xe2\x96\x81\x62" /* ▁b */};
  static const float scores[] = {0.0f, 0.0f, 0.0f, -1.0f, -2.0f};
  npu_gguf_writer_add_str(w, "general.architecture", "llama");
  npu_gguf_writer_add_u32(w, "llama.embedding_length", 8);
  npu_gguf_writer_add_f32(w, "llama.rope.freq_base", 10000.0f);
  npu_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", true);
  npu_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", tokens, 5);
  npu_gguf_writer_add_arr(w, "tokenizer.ggml.scores", NPU_GGUF_F32, scores, 5);
  npu_gguf_writer_add_u8(w, "seed.u8", 200);
  npu_gguf_writer_add_i8(w, "seed.i8", -100);
  npu_gguf_writer_add_u16(w, "seed.u16", 60000);
  npu_gguf_writer_add_i16(w, "seed.i16", -30000);
  npu_gguf_writer_add_i32(w, "seed.i32", -2000000000);
  npu_gguf_writer_add_u64(w, "seed.u64", 0xfedcba9876543210ull);
  npu_gguf_writer_add_i64(w, "seed.i64", -5);
  npu_gguf_writer_add_f64(w, "seed.f64", 3.14159265358979);
  npu_gguf_writer_add_str(w, "seed.empty", "");
  static const int32_t i32s[] = {-1, 0, 1, 2147483647};
  npu_gguf_writer_add_arr(w, "seed.arr_i32", NPU_GGUF_I32, i32s, 4);
  npu_gguf_writer_add_arr(w, "seed.arr_empty", NPU_GGUF_U8, NULL, 0);
}

/* Arrays of arrays: of u16, of strings, and one level deeper. */
static void add_nested(struct npu_gguf_writer *w) {
  struct npu_gguf_buf b = {0};
  npu_gguf_buf_put_u32(&b, NPU_GGUF_ARR);
  npu_gguf_buf_put_u64(&b, 2);
  for (int i = 0; i < 2; i++) {
    npu_gguf_buf_put_u32(&b, NPU_GGUF_U16);
    npu_gguf_buf_put_u64(&b, 3);
    for (int j = 0; j < 3; j++) npu_gguf_buf_put_u16(&b, (uint16_t)(10 * i + j));
  }
  npu_gguf_writer_add_raw(w, "seed.nested_u16", NPU_GGUF_ARR, b.data, b.size);
  npu_gguf_buf_free(&b);
  npu_gguf_buf_put_u32(&b, NPU_GGUF_ARR);
  npu_gguf_buf_put_u64(&b, 1);
  npu_gguf_buf_put_u32(&b, NPU_GGUF_STR);
  npu_gguf_buf_put_u64(&b, 2);
  npu_gguf_buf_put_str(&b, "ab");
  npu_gguf_buf_put_str(&b, "");
  npu_gguf_writer_add_raw(w, "seed.nested_str", NPU_GGUF_ARR, b.data, b.size);
  npu_gguf_buf_free(&b);
  npu_gguf_buf_put_u32(&b, NPU_GGUF_ARR);
  npu_gguf_buf_put_u64(&b, 1);
  npu_gguf_buf_put_u32(&b, NPU_GGUF_ARR);
  npu_gguf_buf_put_u64(&b, 1);
  npu_gguf_buf_put_u32(&b, NPU_GGUF_F64);
  npu_gguf_buf_put_u64(&b, 1);
  npu_gguf_buf_put_f64(&b, -0.5);
  npu_gguf_writer_add_raw(w, "seed.nested_deep", NPU_GGUF_ARR, b.data, b.size);
  if (b.failed) die("nested arrays", NULL);
  npu_gguf_buf_free(&b);
}

/* A vector and a matrix of ggml 'type' (rows of 32 values: one Q8_0 block), seeded values. */
static void add_tensors(struct npu_gguf_writer *w, uint32_t type, const char *prefix) {
  char name[64];
  const uint64_t vec[1] = {3}, mat[2] = {32, 2};
  snprintf(name, sizeof(name), "%s.vector", prefix);
  npu_gguf_writer_add_tensor(w, name, type == NPU_GGML_Q8_0 ? NPU_GGML_F32 : type, 1, vec, NULL);
  snprintf(name, sizeof(name), "%s.weight", prefix);
  npu_gguf_writer_add_tensor(w, name, type, 2, mat, NULL);
}

static void write_tensor_data(struct npu_gguf_writer *w, uint32_t type, npulm_error *err) {
  float v[64];
  for (int i = 0; i < 64; i++) v[i] = (float)(i - 20) / 8.0f;
  uint8_t bytes[256];
  size_t n;
  /* the vector: 3 values */
  if (type == NPU_GGML_F16 || type == NPU_GGML_BF16) {
    for (int i = 0; i < 3; i++) { /* 1.0, -2.0, 0.5 in both half formats' top bits */
      static const uint16_t f16[3] = {0x3c00, 0xc000, 0x3800}, bf16[3] = {0x3f80, 0xc000, 0x3f00};
      uint16_t h = type == NPU_GGML_F16 ? f16[i] : bf16[i];
      memcpy(bytes + 2 * i, &h, 2);
    }
    n = 6;
  } else {
    memcpy(bytes, v, 3 * sizeof(float));
    n = 3 * sizeof(float);
  }
  npu_gguf_writer_write_data(w, bytes, n, err);
  /* the matrix: 64 values */
  if (type == NPU_GGML_Q8_0) {
    npu_ggml_q8_0_from_f32(v, bytes, 64 / NPU_Q8_0_BLOCK);
    n = 64 / NPU_Q8_0_BLOCK * NPU_Q8_0_BLOCK_BYTES;
  } else if (type == NPU_GGML_F16 || type == NPU_GGML_BF16) {
    for (int i = 0; i < 64; i++) {
      uint16_t h = (uint16_t)(type == NPU_GGML_F16 ? 0x3c00 + i : 0x3f80 + i);
      memcpy(bytes + 2 * i, &h, 2);
    }
    n = 128;
  } else {
    memcpy(bytes, v, sizeof(v));
    n = sizeof(v);
  }
  npu_gguf_writer_write_data(w, bytes, n, err);
}

/* One row of one block of every block type the reader converts (Q4_0 .. TQ2_0), its bytes a
 * seeded pattern whose f16 scales stay small and finite. */
static void add_block_tensors(struct npu_gguf_writer *w, npulm_error *err) {
  size_t n = 0, index[64];
  for (uint32_t type = 0; type < 64; type++) {
    uint32_t block, nbytes;
    if (npu_ggml_type_to_f32(type) == NULL || !npu_ggml_type_size(type, &block, &nbytes) ||
        block == 1) {
      continue;
    }
    char name[32];
    snprintf(name, sizeof(name), "blocks.%s", npu_ggml_type_name(type));
    const uint64_t ne[1] = {block};
    npu_gguf_writer_add_tensor(w, name, type, 1, ne, &index[n++]);
  }
  uint8_t bytes[512];
  uint32_t x = 12345;
  for (size_t i = 0; i < n; i++) {
    size_t nb = (size_t)npu_gguf_writer_tensor_nbytes(w, index[i]);
    for (size_t j = 0; j < nb && j < sizeof(bytes); j++) {
      x = x * 1664525u + 1013904223u;
      bytes[j] = (uint8_t)(x >> 24);
      if ((bytes[j] & 0x7c) == 0x7c) bytes[j] &= 0x3f; /* no f16 exponent of all ones */
    }
    npu_gguf_writer_write_tensor(w, index[i], bytes, err);
  }
}

static void write_seed(const char *dir, const char *name, enum seed_kind kind, uint32_t type) {
  struct npu_gguf_writer *w;
  npulm_error err;
  if (npu_gguf_writer_open_memory(&w, &err) != NPULM_OK) die("writer", &err);
  if (kind == S_V2) npu_gguf_writer_set_version(w, 2);
  if (kind == S_ALIGN1 || kind == S_ALIGN64) {
    npu_gguf_writer_add_u32(w, "general.alignment", kind == S_ALIGN1 ? 1 : 64);
  }
  if (kind != S_EMPTY) add_keys(w);
  if (kind == S_NESTED) add_nested(w);
  if (kind == S_BLOCKS) add_block_tensors(w, &err);
  bool tensors = kind == S_TENSORS || kind == S_V2 || kind == S_ALIGN1 || kind == S_ALIGN64;
  if (tensors) {
    add_tensors(w, type, "a");
    add_tensors(w, NPU_GGML_F16, "b"); /* 6-byte vectors: the next tensor's padding shows */
    write_tensor_data(w, type, &err);
    write_tensor_data(w, NPU_GGML_F16, &err);
  }
  void *image;
  size_t size;
  if (npu_gguf_writer_finish(w, &err) != NPULM_OK ||
      npu_gguf_writer_take_memory(w, &image, &size, &err) != NPULM_OK) {
    die(name, &err);
  }
  npu_gguf_writer_free(w);
  char path[512];
  snprintf(path, sizeof(path), "%s/%s.gguf", dir, name);
  FILE *f = fopen(path, "wb");
  if (f == NULL || fwrite(image, 1, size, f) != size || fclose(f) != 0) die(path, NULL);
  fprintf(stderr, "wrote %s (%zu bytes)\n", path, size);
  free(image);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  const char *dir = getenv("NPULM_FUZZ_SEEDS");
  if (dir == NULL) return 0;
  write_seed(dir, "empty", S_EMPTY, 0);
  write_seed(dir, "keys", S_KEYS, 0);
  write_seed(dir, "nested", S_NESTED, 0);
  write_seed(dir, "f32", S_TENSORS, NPU_GGML_F32);
  write_seed(dir, "f16", S_TENSORS, NPU_GGML_F16);
  write_seed(dir, "bf16", S_TENSORS, NPU_GGML_BF16);
  write_seed(dir, "q8_0", S_TENSORS, NPU_GGML_Q8_0);
  write_seed(dir, "blocks", S_BLOCKS, 0);
  write_seed(dir, "v2", S_V2, NPU_GGML_Q8_0);
  write_seed(dir, "align1", S_ALIGN1, NPU_GGML_F32);
  write_seed(dir, "align64", S_ALIGN64, NPU_GGML_BF16);
  exit(0);
}

/* ---- The harness --------------------------------------------------------------------------- */

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
