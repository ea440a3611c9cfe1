/* The encodings file of an export, written as it is made (encodings.h). */
#include "export/encodings.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "base/common.h"

static void fail_nomem(struct npu_encodings *e) {
  if (e->status != NPULM_OK) return;
  e->status = npu_fail(&e->err, NPULM_ERR_NOMEM, "%s", "out of memory writing the encodings");
}

/* Append 'n' bytes to the file, and to its digest. */
static void emit(struct npu_encodings *e, const void *bytes, size_t n) {
  if (e->status != NPULM_OK) return;
  e->status = npu_afile_write(&e->file, bytes, n, &e->err);
  if (e->status == NPULM_OK && XXH3_64bits_update(e->hash, bytes, n) != XXH_OK) fail_nomem(e);
}

/* Append formatted text to the file. */
static void put(struct npu_encodings *e, const char *fmt, ...) NPU_PRINTF(2, 3);
static void put(struct npu_encodings *e, const char *fmt, ...) {
  if (e->status != NPULM_OK) return;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  const int n = vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof(buf)) {
    e->status = npu_fail(&e->err, NPULM_ERR_ARG, "%s", "an encodings entry too long to write");
    return;
  }
  emit(e, buf, (size_t)n);
}

/* 'name' as a JSON string, quoted, with quotes, backslashes and control characters escaped (the
 * names are npulm's own, ASCII), into 'dst' (room for json_string_room(name) bytes); returns its
 * length. */
static size_t json_string_room(const char *name) { return 6 * strlen(name) + 3; }
static size_t json_string(char *dst, const char *name) {
  char *at = dst;
  *at++ = '"';
  for (const char *c = name; *c != '\0'; c++) {
    if (*c == '"' || *c == '\\') at += sprintf(at, "\\%c", *c);
    else if ((unsigned char)*c < 0x20) at += sprintf(at, "\\u%04x", (unsigned)(unsigned char)*c);
    else *at++ = *c;
  }
  *at++ = '"';
  *at = '\0';
  return (size_t)(at - dst);
}

static void put_name(struct npu_encodings *e, const char *name) {
  char *quoted = malloc(json_string_room(name));
  if (quoted == NULL) {
    fail_nomem(e);
    return;
  }
  emit(e, quoted, json_string(quoted, name));
  free(quoted);
}

/* The fields of one encoding, in AIMET's unsigned frame (encodings.h). */
static int entry_text(char *buf, size_t cap, int bits, double scale, int64_t zero_point,
                      bool symmetric) {
  const int64_t offset = -(zero_point + ((int64_t)1 << (bits - 1)));
  const double lo = (double)offset * scale;
  const double hi = (double)(offset + ((int64_t)1 << bits) - 1) * scale;
  return snprintf(buf, cap,
                  "\"bitwidth\": %d, \"dtype\": \"int\", \"is_symmetric\": \"%s\", \"scale\": "
                  "%.9g, \"offset\": %lld, \"min\": %.9g, \"max\": %.9g",
                  bits, symmetric ? "True" : "False", scale, (long long)offset, lo, hi);
}

npulm_status npu_encodings_open(struct npu_encodings *e, const char *path, npulm_error *err) {
  memset(e, 0, sizeof(*e));
  e->channels = -1;
  e->hash = XXH3_createState();
  if (e->hash == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "%s", "out of memory");
  XXH3_64bits_reset(e->hash);
  npulm_status st = npu_afile_open(path, &e->file, err);
  if (st != NPULM_OK) {
    XXH3_freeState(e->hash);
    e->hash = NULL;
    return st;
  }
  put(e, "%s", "{\n \"version\": \"0.6.1\",\n \"param_encodings\": {");
  return NPULM_OK;
}

void npu_encodings_activation(struct npu_encodings *e, const char *name, int bits, double scale,
                              int32_t zero_point) {
  if (e->status != NPULM_OK) return;
  char fields[256];
  entry_text(fields, sizeof(fields), bits, scale, zero_point, zero_point == 0);
  const size_t need = e->act_len + json_string_room(name) + strlen(fields) + 32;
  if (need > e->act_cap) {
    const size_t cap = need > 2 * e->act_cap ? need : 2 * e->act_cap;
    char *grown = realloc(e->activations, cap);
    if (grown == NULL) {
      fail_nomem(e);
      return;
    }
    e->activations = grown;
    e->act_cap = cap;
  }
  char *at = e->activations + e->act_len;
  at += sprintf(at, "%s\n  ", e->act_len > 0 ? "," : "");
  at += json_string(at, name);
  at += sprintf(at, ": [{%s}]", fields);
  e->act_len = (size_t)(at - e->activations);
}

void npu_encodings_param_begin(struct npu_encodings *e, const char *name) {
  put(e, "%s\n  ", e->params > 0 ? "," : "");
  put_name(e, name);
  put(e, "%s", ": [");
  e->params++;
  e->channels = 0;
}

void npu_encodings_param_channel(struct npu_encodings *e, int bits, double scale,
                                 const uint8_t *block_scales, int32_t n_blocks,
                                 int32_t block_size) {
  char fields[256];
  entry_text(fields, sizeof(fields), bits, scale, 0, true);
  put(e, "%s\n   {%s", e->channels > 0 ? "," : "", fields);
  if (n_blocks > 0) {
    put(e, ", \"block_size\": %d, \"per_block_int_scale\": [", (int)block_size);
    /* a channel's scales (4 bits each, at most 1024 blocks) in one write: an 8B model has
     * hundreds of millions */
    char list[NPU_ENCODINGS_MAX_BLOCKS * 4];
    size_t at = 0;
    for (int32_t b = 0; b < n_blocks && b < NPU_ENCODINGS_MAX_BLOCKS; b++) {
      at += (size_t)snprintf(list + at, sizeof(list) - at, "%s%u", b > 0 ? "," : "",
                             (unsigned)block_scales[b]);
    }
    emit(e, list, at);
    put(e, "%s", "]");
  }
  put(e, "%s", "}");
  e->channels++;
}

void npu_encodings_param_end(struct npu_encodings *e) {
  put(e, "%s", "]");
  e->channels = -1;
}

static void release(struct npu_encodings *e) {
  XXH3_freeState(e->hash);
  e->hash = NULL;
  free(e->activations);
  e->activations = NULL;
  e->act_len = e->act_cap = 0;
}

npulm_status npu_encodings_commit(struct npu_encodings *e, const char *quantizer_args,
                                  uint64_t *digest_out, npulm_error *err) {
  put(e, "%s", "\n },\n \"activation_encodings\": {");
  if (e->act_len > 0) emit(e, e->activations, e->act_len);
  put(e, "%s", "\n },\n \"excluded_layers\": [],\n \"quantizer_args\": ");
  put(e, "%s", quantizer_args);
  put(e, "%s", "\n}\n");
  if (e->status == NPULM_OK) *digest_out = XXH3_64bits_digest(e->hash);
  release(e);
  if (e->status != NPULM_OK) {
    npu_afile_abort(&e->file);
    if (err != NULL) *err = e->err;
    return e->status;
  }
  return npu_afile_commit(&e->file, err);
}

void npu_encodings_abort(struct npu_encodings *e) {
  npu_afile_abort(&e->file);
  release(e);
}
