/* ONNX model writer: the model is kept in memory as the caller builds it, then encoded by hand in
 * protobuf's wire format, its small messages in buffers and its initializers' bytes streamed. */
#include "export/onnx_write.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/atomic_file.h"
#include "base/common.h"
#include "io/gguf_write.h" /* struct npu_gguf_buf: a growable byte buffer with a sticky failure */

/* protobuf's limit on one message (a model file read whole is one message) */
#define PROTOBUF_MAX_BYTES ((uint64_t)INT32_MAX)
#define EXTERNAL_ALIGN 64 /* of each tensor's offset in the data file */
/* Smaller initializers stay inside the model in an external write, as onnx's own
 * convert_model_to_external_data leaves them (its size_threshold): ONNX Runtime's shape inference
 * reads a Reshape's shape only from the model file. */
#define EXTERNAL_MIN 1024
#define IR_VERSION 8 /* ONNX IR of opset 17 */

/* ---- Field numbers (onnx/onnx.proto) ------------------------------------------------------- */

enum {
  MODEL_IR_VERSION = 1,
  MODEL_PRODUCER_NAME = 2,
  MODEL_PRODUCER_VERSION = 3,
  MODEL_DOC_STRING = 6,
  MODEL_GRAPH = 7,
  MODEL_OPSET_IMPORT = 8,
  MODEL_METADATA_PROPS = 14,
  OPSET_DOMAIN = 1,
  OPSET_VERSION = 2,
  ENTRY_KEY = 1, /* StringStringEntryProto */
  ENTRY_VALUE = 2,
  GRAPH_NODE = 1,
  GRAPH_NAME = 2,
  GRAPH_INITIALIZER = 5,
  GRAPH_INPUT = 11,
  GRAPH_OUTPUT = 12,
  NODE_INPUT = 1,
  NODE_OUTPUT = 2,
  NODE_NAME = 3,
  NODE_OP_TYPE = 4,
  NODE_ATTRIBUTE = 5,
  NODE_DOMAIN = 7,
  ATTR_NAME = 1,
  ATTR_F = 2,
  ATTR_I = 3,
  ATTR_S = 4,
  ATTR_INTS = 8,
  ATTR_TYPE = 20,
  TENSOR_DIMS = 1,
  TENSOR_DATA_TYPE = 2,
  TENSOR_NAME = 8,
  TENSOR_RAW_DATA = 9,
  TENSOR_EXTERNAL_DATA = 13,
  TENSOR_DATA_LOCATION = 14,
  VALUE_INFO_NAME = 1,
  VALUE_INFO_TYPE = 2,
  TYPE_TENSOR_TYPE = 1,
  TENSOR_TYPE_ELEM_TYPE = 1,
  TENSOR_TYPE_SHAPE = 2,
  SHAPE_DIM = 1,
  DIM_VALUE = 1,
};

enum { WIRE_VARINT = 0, WIRE_LEN = 2, WIRE_FIXED32 = 5 };
enum { DATA_LOCATION_EXTERNAL = 1 };

/* AttributeProto.AttributeType values of the attributes one can add */
enum attr_kind { ATTR_KIND_FLOAT = 1, ATTR_KIND_INT = 2, ATTR_KIND_STRING = 3, ATTR_KIND_INTS = 7 };

/* ---- The model in memory -------------------------------------------------------------------- */

struct shape {
  enum npu_onnx_dtype dt;
  int nd;
  int64_t dims[NPU_ONNX_MAX_DIMS];
};

struct io_value { /* a graph input or output */
  char *name;
  struct shape shape;
};

struct init {
  char *name;
  struct shape shape;
  uint64_t nbytes;
  uint8_t *data; /* copied bytes, or NULL for a lazy one */
  npu_onnx_fill_fn *fill;
  void *user;
  uint64_t offset; /* in the data file, while an external write runs */
  uint64_t digest; /* XXH3-64 of its bytes, set as they are written */
};

struct attr {
  char *name;
  enum attr_kind kind;
  float f;
  int64_t i;
  char *s;
  int64_t *ints;
  int n_ints;
};

struct npu_onnx_node {
  struct npu_onnx *model;
  char *op_type;
  char *domain; /* NULL: ai.onnx */
  char *name;
  char **in;
  int n_in;
  char **out;
  int n_out;
  struct attr *attrs;
  int n_attrs;
};

struct meta {
  char *key;
  char *value;
};

/* The names of the values defined so far: open addressing, pointers to names the model owns. */
struct name_set {
  const char **slots;
  size_t cap; /* a power of two, or 0 */
  size_t n;
};

struct npu_onnx {
  char *graph_name;
  int64_t opset;
  char *doc;
  struct meta *meta;
  size_t n_meta, cap_meta;
  char **domains; /* imported besides ai.onnx, in order of first use */
  size_t n_domains, cap_domains;
  struct io_value *inputs;
  size_t n_inputs, cap_inputs;
  struct io_value *outputs;
  size_t n_outputs, cap_outputs;
  struct init *inits;
  size_t n_inits, cap_inits;
  struct npu_onnx_node **nodes;
  size_t n_nodes, cap_nodes;
  struct name_set defined;
  /* the first failure; every later call does nothing */
  npulm_status status;
  npulm_error error;
};

size_t npu_onnx_dtype_size(enum npu_onnx_dtype dt) {
  switch (dt) {
  case NPU_ONNX_UINT8:
  case NPU_ONNX_INT8: return 1;
  case NPU_ONNX_UINT16:
  case NPU_ONNX_INT16: return 2;
  case NPU_ONNX_FLOAT:
  case NPU_ONNX_INT32: return 4;
  case NPU_ONNX_INT64: return 8;
  }
  return 0;
}

/* Record the first failure. */
static void NPU_PRINTF(3, 4) fail(struct npu_onnx *o, npulm_status status, const char *fmt, ...) {
  if (o->status != NPULM_OK) return;
  char msg[NPULM_ERROR_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  o->status = npu_fail(&o->error, status, "%s", msg);
}

static void fail_nomem(struct npu_onnx *o, const char *what) {
  fail(o, NPULM_ERR_NOMEM, "out of memory adding ONNX %s", what);
}

/* Array 'items' ('*cap' items of 'size' bytes) with room for item 'n': itself, or a larger one
 * ('*cap' updated; 'items' is then gone), or NULL if out of memory ('items' as it was). */
static void *grow(void *items, size_t *cap, size_t n, size_t size) {
  if (n < *cap) return items;
  size_t new_cap = *cap ? 2 * *cap : 16;
  if (new_cap > SIZE_MAX / size) return NULL;
  void *grown = realloc(items, new_cap * size);
  if (grown != NULL) *cap = new_cap;
  return grown;
}

/* FNV-1a */
static size_t name_hash(const char *s) {
  uint64_t h = 14695981039346656037ull;
  for (; *s != '\0'; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return (size_t)h;
}

static bool set_has(const struct name_set *set, const char *name) {
  if (set->cap == 0) return false;
  for (size_t i = name_hash(name) & (set->cap - 1);; i = (i + 1) & (set->cap - 1)) {
    if (set->slots[i] == NULL) return false;
    if (strcmp(set->slots[i], name) == 0) return true;
  }
}

static void set_insert(const char **slots, size_t cap, const char *name) {
  size_t i = name_hash(name) & (cap - 1);
  while (slots[i] != NULL) i = (i + 1) & (cap - 1);
  slots[i] = name;
}

/* Add 'name' (not in the set; it must outlive the set); false if out of memory. */
static bool set_add(struct name_set *set, const char *name) {
  if (2 * (set->n + 1) > set->cap) { /* at most half full, so probes stay short */
    size_t cap = set->cap ? 2 * set->cap : 64;
    if (cap > SIZE_MAX / sizeof(*set->slots)) return false;
    const char **slots = calloc(cap, sizeof(*slots));
    if (slots == NULL) return false;
    for (size_t i = 0; i < set->cap; i++) {
      if (set->slots[i] != NULL) set_insert(slots, cap, set->slots[i]);
    }
    free(set->slots);
    set->slots = slots;
    set->cap = cap;
  }
  set_insert(set->slots, set->cap, name);
  set->n++;
  return true;
}

/* A copy of 'name' (a 'what': "value", "node", ...) after checking it; NULL after a failure. */
static char *copy_name(struct npu_onnx *o, const char *what, const char *name) {
  if (o->status != NPULM_OK) return NULL;
  if (name == NULL || name[0] == '\0') {
    fail(o, NPULM_ERR_ARG, "ONNX %s with an empty name", what);
    return NULL;
  }
  if (strnlen(name, NPU_ONNX_NAME_MAX + 1) > NPU_ONNX_NAME_MAX) {
    fail(o, NPULM_ERR_ARG, "ONNX %s name '%.40s...' is longer than %d bytes", what, name,
         NPU_ONNX_NAME_MAX);
    return NULL;
  }
  char *copy = strdup(name);
  if (copy == NULL) fail_nomem(o, what);
  return copy;
}

/* A copy of any string (a doc, a metadata value, a string attribute); NULL after a failure. */
static char *copy_text(struct npu_onnx *o, const char *text) {
  if (o->status != NPULM_OK) return NULL;
  char *copy = strdup(text != NULL ? text : "");
  if (copy == NULL) fail_nomem(o, "text");
  return copy;
}

/* Whether 'name' may be defined (a failure if it is defined already). */
static bool value_is_new(struct npu_onnx *o, const char *name) {
  if (!set_has(&o->defined, name)) return true;
  fail(o, NPULM_ERR_ARG, "ONNX value '%s' is defined twice", name);
  return false;
}

/* Define value 'name' (a copy the model owns); false after a failure. */
static bool define_value(struct npu_onnx *o, const char *name) {
  if (!value_is_new(o, name)) return false;
  if (!set_add(&o->defined, name)) {
    fail_nomem(o, "value");
    return false;
  }
  return true;
}

/* Check and copy a tensor type for 'name'; '*nbytes_out' its size. False after a failure. */
static bool make_shape(struct npu_onnx *o, const char *name, enum npu_onnx_dtype dt, int nd,
                       const int64_t *dims, struct shape *shape_out, uint64_t *nbytes_out) {
  size_t elem = npu_onnx_dtype_size(dt);
  if (elem == 0) {
    fail(o, NPULM_ERR_ARG, "ONNX value '%s': unknown data type %d", name, (int)dt);
    return false;
  }
  if (nd < 0 || nd > NPU_ONNX_MAX_DIMS || (nd > 0 && dims == NULL)) {
    fail(o, NPULM_ERR_ARG, "ONNX value '%s': %d dimensions (0..%d allowed)", name, nd,
         NPU_ONNX_MAX_DIMS);
    return false;
  }
  *shape_out = (struct shape){.dt = dt, .nd = nd};
  uint64_t nbytes = elem;
  for (int d = 0; d < nd; d++) {
    if (dims[d] < 1 || !npu_mul_u64(nbytes, (uint64_t)dims[d], &nbytes) || nbytes > INT64_MAX ||
        nbytes > SIZE_MAX) {
      fail(o, NPULM_ERR_ARG, "ONNX value '%s': bad shape (dimension %d = %" PRId64 ")", name, d,
           dims[d]);
      return false;
    }
    shape_out->dims[d] = dims[d];
  }
  *nbytes_out = nbytes;
  return true;
}

struct npu_onnx *npu_onnx_new(const char *graph_name, int64_t opset) {
  struct npu_onnx *o = calloc(1, sizeof(*o));
  if (o == NULL) return NULL;
  o->opset = opset;
  o->graph_name = copy_name(o, "graph", graph_name);
  return o;
}

static void free_node(struct npu_onnx_node *n) {
  if (n == NULL) return;
  free(n->op_type);
  free(n->domain);
  free(n->name);
  for (int i = 0; i < n->n_in; i++) free(n->in[i]);
  free(n->in);
  for (int i = 0; i < n->n_out; i++) free(n->out[i]);
  free(n->out);
  for (int i = 0; i < n->n_attrs; i++) {
    free(n->attrs[i].name);
    free(n->attrs[i].s);
    free(n->attrs[i].ints);
  }
  free(n->attrs);
  free(n);
}

static void free_io_values(struct io_value *values, size_t n) {
  for (size_t i = 0; i < n; i++) free(values[i].name);
  free(values);
}

void npu_onnx_free(struct npu_onnx *o) {
  if (o == NULL) return;
  free(o->graph_name);
  free(o->doc);
  for (size_t i = 0; i < o->n_meta; i++) {
    free(o->meta[i].key);
    free(o->meta[i].value);
  }
  free(o->meta);
  for (size_t i = 0; i < o->n_domains; i++) free(o->domains[i]);
  free(o->domains);
  free_io_values(o->inputs, o->n_inputs);
  free_io_values(o->outputs, o->n_outputs);
  for (size_t i = 0; i < o->n_inits; i++) {
    free(o->inits[i].name);
    free(o->inits[i].data);
  }
  free(o->inits);
  for (size_t i = 0; i < o->n_nodes; i++) free_node(o->nodes[i]);
  free(o->nodes);
  free(o->defined.slots);
  free(o);
}

npulm_status npu_onnx_status(const struct npu_onnx *o, npulm_error *err) {
  if (o->status != NPULM_OK && err != NULL) *err = o->error;
  return o->status;
}

bool npu_onnx_has_value(const struct npu_onnx *o, const char *name) {
  return name != NULL && set_has(&o->defined, name);
}

/* ---- Building ------------------------------------------------------------------------------- */

void npu_onnx_metadata(struct npu_onnx *o, const char *key, const char *value) {
  char *key_copy = copy_name(o, "metadata key", key);
  char *value_copy = copy_text(o, value);
  for (size_t i = 0; i < o->n_meta && o->status == NPULM_OK; i++) {
    if (strcmp(o->meta[i].key, key_copy) == 0) {
      fail(o, NPULM_ERR_ARG, "ONNX metadata key '%s' is set twice", key_copy);
    }
  }
  struct meta *meta = NULL;
  if (o->status == NPULM_OK) {
    meta = grow(o->meta, &o->cap_meta, o->n_meta, sizeof(*meta));
    if (meta == NULL) fail_nomem(o, "metadata");
  }
  if (o->status != NPULM_OK) {
    free(key_copy);
    free(value_copy);
    return;
  }
  o->meta = meta;
  o->meta[o->n_meta++] = (struct meta){key_copy, value_copy};
}

void npu_onnx_doc(struct npu_onnx *o, const char *doc) {
  char *copy = copy_text(o, doc);
  if (copy == NULL) return;
  free(o->doc);
  o->doc = copy;
}

/* Add a graph input ('define': it defines its value) or output to 'values'. */
static void add_io(struct npu_onnx *o, struct io_value **values, size_t *n, size_t *cap,
                   const char *what, bool define, const char *name, enum npu_onnx_dtype dt, int nd,
                   const int64_t *dims) {
  struct io_value v = {.name = copy_name(o, what, name)};
  uint64_t nbytes;
  if (v.name == NULL || !make_shape(o, v.name, dt, nd, dims, &v.shape, &nbytes)) goto fail;
  for (size_t i = 0; i < *n; i++) {
    if (strcmp((*values)[i].name, v.name) == 0) {
      fail(o, NPULM_ERR_ARG, "ONNX %s '%s' is listed twice", what, v.name);
      goto fail;
    }
  }
  struct io_value *grown = grow(*values, cap, *n, sizeof(*grown));
  if (grown == NULL) {
    fail_nomem(o, what);
    goto fail;
  }
  *values = grown;
  if (define && !define_value(o, v.name)) goto fail;
  grown[(*n)++] = v;
  return;
fail:
  free(v.name);
}

void npu_onnx_input(struct npu_onnx *o, const char *name, enum npu_onnx_dtype dt, int nd,
                    const int64_t *dims) {
  add_io(o, &o->inputs, &o->n_inputs, &o->cap_inputs, "graph input", true, name, dt, nd, dims);
}

void npu_onnx_output(struct npu_onnx *o, const char *name, enum npu_onnx_dtype dt, int nd,
                     const int64_t *dims) {
  add_io(o, &o->outputs, &o->n_outputs, &o->cap_outputs, "graph output", false, name, dt, nd, dims);
}

/* Add an initializer; its bytes are 'data' (copied) or made by 'fill'. */
static void add_init(struct npu_onnx *o, const char *name, enum npu_onnx_dtype dt, int nd,
                     const int64_t *dims, const void *data, npu_onnx_fill_fn *fill, void *user) {
  struct init t = {.name = copy_name(o, "initializer", name), .fill = fill, .user = user};
  if (t.name == NULL || !make_shape(o, t.name, dt, nd, dims, &t.shape, &t.nbytes)) goto fail;
  if (data == NULL && fill == NULL) {
    fail(o, NPULM_ERR_ARG, "ONNX initializer '%s' has no bytes", t.name);
    goto fail;
  }
  if (data != NULL) {
    t.data = malloc((size_t)t.nbytes);
    if (t.data == NULL) {
      fail_nomem(o, "initializer");
      goto fail;
    }
    memcpy(t.data, data, (size_t)t.nbytes);
  }
  struct init *inits = grow(o->inits, &o->cap_inits, o->n_inits, sizeof(*inits));
  if (inits == NULL) {
    fail_nomem(o, "initializer");
    goto fail;
  }
  o->inits = inits;
  if (!define_value(o, t.name)) goto fail;
  inits[o->n_inits++] = t;
  return;
fail:
  free(t.name);
  free(t.data);
}

void npu_onnx_init_copy(struct npu_onnx *o, const char *name, enum npu_onnx_dtype dt, int nd,
                        const int64_t *dims, const void *data) {
  if (data == NULL) {
    fail(o, NPULM_ERR_ARG, "ONNX initializer '%s' has no bytes", name != NULL ? name : "");
    return;
  }
  add_init(o, name, dt, nd, dims, data, NULL, NULL);
}

void npu_onnx_init_lazy(struct npu_onnx *o, const char *name, enum npu_onnx_dtype dt, int nd,
                        const int64_t *dims, npu_onnx_fill_fn *fill, void *user) {
  add_init(o, name, dt, nd, dims, NULL, fill, user);
}

void npu_onnx_init_f32(struct npu_onnx *o, const char *name, float v) {
  npu_onnx_init_copy(o, name, NPU_ONNX_FLOAT, 0, NULL, &v);
}

void npu_onnx_init_i64s(struct npu_onnx *o, const char *name, int n, const int64_t *v) {
  const int64_t dims[1] = {n};
  npu_onnx_init_copy(o, name, NPU_ONNX_INT64, 1, dims, v);
}

/* Import 'domain' (version 1) unless it is already. */
static void import_domain(struct npu_onnx *o, const char *domain) {
  for (size_t i = 0; i < o->n_domains; i++) {
    if (strcmp(o->domains[i], domain) == 0) return;
  }
  char *copy = copy_name(o, "domain", domain);
  if (copy == NULL) return;
  char **domains = grow(o->domains, &o->cap_domains, o->n_domains, sizeof(*domains));
  if (domains == NULL) {
    free(copy);
    fail_nomem(o, "domain");
    return;
  }
  o->domains = domains;
  domains[o->n_domains++] = copy;
}

/* Copies of the 'n' names 'names' (a 'what'; "" allowed where 'optional') into '*copies_out',
 * '*count_out' of them (set as soon as they are to be freed). */
static void copy_names(struct npu_onnx *o, const char *what, bool optional, int n,
                       const char *const *names, char ***copies_out, int *count_out) {
  if (o->status != NPULM_OK) return;
  if (n < 0 || (n > 0 && names == NULL)) {
    fail(o, NPULM_ERR_ARG, "ONNX node with %d %ss", n, what);
    return;
  }
  *copies_out = calloc(n > 0 ? (size_t)n : 1, sizeof(**copies_out));
  if (*copies_out == NULL) {
    fail_nomem(o, what);
    return;
  }
  *count_out = n;
  for (int i = 0; i < n; i++) {
    bool omitted = optional && names[i] != NULL && names[i][0] == '\0';
    (*copies_out)[i] = omitted ? copy_text(o, "") : copy_name(o, what, names[i]);
  }
}

struct npu_onnx_node *npu_onnx_node(struct npu_onnx *o, const char *op_type, const char *domain,
                                    const char *name, int n_in, const char *const *in, int n_out,
                                    const char *const *out) {
  if (o->status != NPULM_OK) return NULL;
  struct npu_onnx_node *n = calloc(1, sizeof(*n));
  if (n == NULL) {
    fail_nomem(o, "node");
    return NULL;
  }
  n->model = o;
  char default_name[32];
  snprintf(default_name, sizeof(default_name), "n%zu", o->n_nodes);
  n->op_type = copy_name(o, "op type", op_type);
  n->name = copy_name(o, "node", name != NULL ? name : default_name);
  if (domain != NULL && domain[0] != '\0') n->domain = copy_name(o, "domain", domain);
  copy_names(o, "node input", true, n_in, in, &n->in, &n->n_in);
  copy_names(o, "node output", false, n_out, out, &n->out, &n->n_out);
  if (o->status == NPULM_OK && n_out < 1) {
    fail(o, NPULM_ERR_ARG, "ONNX node '%s' has no output", n->name);
  }
  for (int i = 0; i < n->n_in && o->status == NPULM_OK; i++) {
    if (n->in[i][0] != '\0' && !set_has(&o->defined, n->in[i])) {
      fail(o, NPULM_ERR_ARG, "ONNX node '%s': input '%s' is not defined before it", n->name,
           n->in[i]);
    }
  }
  /* every check before the outputs are defined, so that a failure leaves none behind */
  for (int i = 0; i < n->n_out && o->status == NPULM_OK; i++) {
    for (int j = 0; j < i; j++) {
      if (strcmp(n->out[i], n->out[j]) == 0) {
        fail(o, NPULM_ERR_ARG, "ONNX value '%s' is defined twice", n->out[i]);
      }
    }
    value_is_new(o, n->out[i]);
  }
  if (o->status == NPULM_OK) {
    struct npu_onnx_node **nodes = grow(o->nodes, &o->cap_nodes, o->n_nodes, sizeof(*nodes));
    if (nodes == NULL) {
      fail_nomem(o, "node");
    } else {
      o->nodes = nodes;
    }
  }
  if (o->status == NPULM_OK && n->domain != NULL) import_domain(o, n->domain);
  for (int i = 0; i < n->n_out && o->status == NPULM_OK; i++) {
    if (!set_add(&o->defined, n->out[i])) {
      fail_nomem(o, "value");
      /* some of the node's names may be in the set, which must not outlive them */
      free(o->defined.slots);
      o->defined = (struct name_set){0};
    }
  }
  if (o->status != NPULM_OK) {
    free_node(n);
    return NULL;
  }
  o->nodes[o->n_nodes++] = n;
  return n;
}

/* A new attribute 'name' of 'n', or NULL after a failure. */
static struct attr *add_attr(struct npu_onnx_node *n, const char *name, enum attr_kind kind) {
  if (n == NULL) return NULL;
  struct npu_onnx *o = n->model;
  char *copy = copy_name(o, "attribute", name);
  if (copy == NULL) return NULL;
  for (int i = 0; i < n->n_attrs; i++) {
    if (strcmp(n->attrs[i].name, copy) == 0) {
      fail(o, NPULM_ERR_ARG, "ONNX node '%s': attribute '%s' set twice", n->name, copy);
      free(copy);
      return NULL;
    }
  }
  struct attr *attrs = realloc(n->attrs, ((size_t)n->n_attrs + 1) * sizeof(*attrs));
  if (attrs == NULL) {
    fail_nomem(o, "attribute");
    free(copy);
    return NULL;
  }
  n->attrs = attrs;
  struct attr *a = &attrs[n->n_attrs++];
  *a = (struct attr){.name = copy, .kind = kind};
  return a;
}

void npu_onnx_attr_int(struct npu_onnx_node *n, const char *name, int64_t v) {
  struct attr *a = add_attr(n, name, ATTR_KIND_INT);
  if (a != NULL) a->i = v;
}

void npu_onnx_attr_float(struct npu_onnx_node *n, const char *name, float v) {
  struct attr *a = add_attr(n, name, ATTR_KIND_FLOAT);
  if (a != NULL) a->f = v;
}

void npu_onnx_attr_ints(struct npu_onnx_node *n, const char *name, int count, const int64_t *v) {
  struct attr *a = add_attr(n, name, ATTR_KIND_INTS);
  if (a == NULL) return;
  if (count < 0 || (count > 0 && v == NULL)) {
    fail(n->model, NPULM_ERR_ARG, "ONNX attribute '%s' with %d ints", name, count);
    return;
  }
  a->ints = malloc((count > 0 ? (size_t)count : 1) * sizeof(*a->ints));
  if (a->ints == NULL) {
    fail_nomem(n->model, "attribute");
    return;
  }
  if (count > 0) memcpy(a->ints, v, (size_t)count * sizeof(*a->ints));
  a->n_ints = count;
}

void npu_onnx_attr_string(struct npu_onnx_node *n, const char *name, const char *v) {
  struct attr *a = add_attr(n, name, ATTR_KIND_STRING);
  if (a != NULL) a->s = copy_text(n->model, v);
}

/* ---- Protobuf encoding ---------------------------------------------------------------------- */

static unsigned varint_size(uint64_t v) {
  unsigned n = 1;
  for (; v >= 0x80; v >>= 7) n++;
  return n;
}

/* A base-128 varint, low groups first (a negative int64 takes all ten bytes). */
static void pb_varint(struct npu_gguf_buf *b, uint64_t v) {
  uint8_t bytes[10];
  size_t n = 0;
  for (; v >= 0x80; v >>= 7) bytes[n++] = (uint8_t)(v | 0x80);
  bytes[n++] = (uint8_t)v;
  npu_gguf_buf_put(b, bytes, n);
}

static void pb_tag(struct npu_gguf_buf *b, unsigned field, unsigned wire) {
  pb_varint(b, (uint64_t)field << 3 | wire);
}

static void pb_int(struct npu_gguf_buf *b, unsigned field, int64_t v) {
  pb_tag(b, field, WIRE_VARINT);
  pb_varint(b, (uint64_t)v);
}

/* The tag and length of a length-delimited field whose 'n' bytes follow. */
static void pb_len(struct npu_gguf_buf *b, unsigned field, uint64_t n) {
  pb_tag(b, field, WIRE_LEN);
  pb_varint(b, n);
}

static void pb_bytes(struct npu_gguf_buf *b, unsigned field, const void *data, size_t n) {
  pb_len(b, field, n);
  npu_gguf_buf_put(b, data, n);
}

static void pb_str(struct npu_gguf_buf *b, unsigned field, const char *s) {
  pb_bytes(b, field, s, strlen(s));
}

/* An embedded message encoded in 'msg' (whose failure carries over), which this frees. */
static void pb_msg(struct npu_gguf_buf *b, unsigned field, struct npu_gguf_buf *msg) {
  if (msg->failed) b->failed = true;
  pb_bytes(b, field, msg->data, msg->size);
  npu_gguf_buf_free(msg);
}

static void pb_float(struct npu_gguf_buf *b, unsigned field, float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  const uint8_t le[4] = {(uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16), (uint8_t)(u >> 24)};
  pb_tag(b, field, WIRE_FIXED32);
  npu_gguf_buf_put(b, le, sizeof(le));
}

static void put_string_entry(struct npu_gguf_buf *b, unsigned field, const char *key,
                             const char *value) {
  struct npu_gguf_buf entry = {0};
  pb_str(&entry, ENTRY_KEY, key);
  pb_str(&entry, ENTRY_VALUE, value);
  pb_msg(b, field, &entry);
}

static void put_opset(struct npu_gguf_buf *b, const char *domain, int64_t version) {
  struct npu_gguf_buf opset = {0};
  pb_str(&opset, OPSET_DOMAIN, domain);
  pb_int(&opset, OPSET_VERSION, version);
  pb_msg(b, MODEL_OPSET_IMPORT, &opset);
}

/* ValueInfoProto of a graph input or output: tensor(dt) with its static shape. */
static void put_value_info(struct npu_gguf_buf *b, unsigned field, const struct io_value *v) {
  struct npu_gguf_buf shape = {0}, tensor = {0}, type = {0}, info = {0};
  for (int d = 0; d < v->shape.nd; d++) {
    pb_len(&shape, SHAPE_DIM, 1 + varint_size((uint64_t)v->shape.dims[d]));
    pb_int(&shape, DIM_VALUE, v->shape.dims[d]);
  }
  pb_int(&tensor, TENSOR_TYPE_ELEM_TYPE, v->shape.dt);
  pb_msg(&tensor, TENSOR_TYPE_SHAPE, &shape);
  pb_msg(&type, TYPE_TENSOR_TYPE, &tensor);
  pb_str(&info, VALUE_INFO_NAME, v->name);
  pb_msg(&info, VALUE_INFO_TYPE, &type);
  pb_msg(b, field, &info);
}

static void put_attr(struct npu_gguf_buf *b, const struct attr *a) {
  struct npu_gguf_buf msg = {0};
  pb_str(&msg, ATTR_NAME, a->name);
  switch (a->kind) {
  case ATTR_KIND_FLOAT: pb_float(&msg, ATTR_F, a->f); break;
  case ATTR_KIND_INT: pb_int(&msg, ATTR_I, a->i); break;
  case ATTR_KIND_STRING: pb_str(&msg, ATTR_S, a->s); break;
  case ATTR_KIND_INTS: /* unpacked, proto2's encoding of a repeated int64 */
    for (int i = 0; i < a->n_ints; i++) pb_int(&msg, ATTR_INTS, a->ints[i]);
    break;
  }
  pb_int(&msg, ATTR_TYPE, a->kind);
  pb_msg(b, NODE_ATTRIBUTE, &msg);
}

static void put_node(struct npu_gguf_buf *b, const struct npu_onnx_node *n) {
  struct npu_gguf_buf msg = {0};
  for (int i = 0; i < n->n_in; i++) pb_str(&msg, NODE_INPUT, n->in[i]);
  for (int i = 0; i < n->n_out; i++) pb_str(&msg, NODE_OUTPUT, n->out[i]);
  pb_str(&msg, NODE_NAME, n->name);
  pb_str(&msg, NODE_OP_TYPE, n->op_type);
  for (int i = 0; i < n->n_attrs; i++) put_attr(&msg, &n->attrs[i]);
  if (n->domain != NULL) pb_str(&msg, NODE_DOMAIN, n->domain);
  pb_msg(b, GRAPH_NODE, &msg);
}

/* TensorProto of initializer 't' but for its bytes: with 'data_name' (external data) the
 * reference to them in that file, else the raw_data field's tag and length, its bytes to follow. */
static void put_tensor_head(struct npu_gguf_buf *b, const struct init *t, const char *data_name) {
  for (int d = 0; d < t->shape.nd; d++) pb_int(b, TENSOR_DIMS, t->shape.dims[d]);
  pb_int(b, TENSOR_DATA_TYPE, t->shape.dt);
  pb_str(b, TENSOR_NAME, t->name);
  if (data_name == NULL) {
    pb_len(b, TENSOR_RAW_DATA, t->nbytes);
    return;
  }
  char number[24];
  put_string_entry(b, TENSOR_EXTERNAL_DATA, "location", data_name);
  snprintf(number, sizeof(number), "%" PRIu64, t->offset);
  put_string_entry(b, TENSOR_EXTERNAL_DATA, "offset", number);
  snprintf(number, sizeof(number), "%" PRIu64, t->nbytes);
  put_string_entry(b, TENSOR_EXTERNAL_DATA, "length", number);
  pb_int(b, TENSOR_DATA_LOCATION, DATA_LOCATION_EXTERNAL);
}

/* The data file's base name for initializer 't' of a write with 'data_name' (NULL: inside). */
static const char *data_file_of(const struct init *t, const char *data_name) {
  return data_name != NULL && t->nbytes >= EXTERNAL_MIN ? data_name : NULL;
}

/* ---- Writing -------------------------------------------------------------------------------- */

/* The model file's bytes but for the initializers, which go between 'graph_head' and
 * 'graph_tail', and the sizes that place them. */
struct plan {
  const char *data_name;          /* base name of the data file, or NULL: initializers inside */
  struct npu_gguf_buf head;       /* ModelProto up to the graph */
  struct npu_gguf_buf graph_head; /* GraphProto up to its initializers */
  struct npu_gguf_buf graph_tail; /* GraphProto after them */
  struct npu_gguf_buf tail;       /* ModelProto after the graph */
  uint64_t graph_size;
  uint64_t model_size;
  uint64_t data_size; /* initializer bytes, padding between them excluded */
  bool any_external;  /* some initializer's bytes go to the data file */
};

static void plan_free(struct plan *p) {
  npu_gguf_buf_free(&p->head);
  npu_gguf_buf_free(&p->graph_head);
  npu_gguf_buf_free(&p->graph_tail);
  npu_gguf_buf_free(&p->tail);
}

/* Bytes of initializer 't''s TensorProto into '*size_out'; false if out of memory. */
static bool tensor_size(const struct init *t, const char *data_name, uint64_t *size_out) {
  struct npu_gguf_buf head = {0};
  put_tensor_head(&head, t, data_name);
  bool ok = !head.failed;
  *size_out = head.size + (data_name == NULL ? t->nbytes : 0);
  npu_gguf_buf_free(&head);
  return ok;
}

/* Encode all but the initializers' bytes into 'p' (external where 'data_name' is not NULL, the
 * data file's offsets set), and size the model. */
static npulm_status make_plan(struct npu_onnx *o, const char *data_name, struct plan *p,
                              npulm_error *err) {
  *p = (struct plan){.data_name = data_name};
  pb_int(&p->head, MODEL_IR_VERSION, IR_VERSION);
  pb_str(&p->head, MODEL_PRODUCER_NAME, "npulm");
  pb_str(&p->head, MODEL_PRODUCER_VERSION, npulm_version());
  if (o->doc != NULL) pb_str(&p->head, MODEL_DOC_STRING, o->doc);
  for (size_t i = 0; i < o->n_nodes; i++) put_node(&p->graph_head, o->nodes[i]);
  pb_str(&p->graph_head, GRAPH_NAME, o->graph_name);
  for (size_t i = 0; i < o->n_inputs; i++)
    put_value_info(&p->graph_tail, GRAPH_INPUT, &o->inputs[i]);
  for (size_t i = 0; i < o->n_outputs; i++) {
    put_value_info(&p->graph_tail, GRAPH_OUTPUT, &o->outputs[i]);
  }
  put_opset(&p->tail, "", o->opset);
  for (size_t i = 0; i < o->n_domains; i++) put_opset(&p->tail, o->domains[i], 1);
  for (size_t i = 0; i < o->n_meta; i++) {
    put_string_entry(&p->tail, MODEL_METADATA_PROPS, o->meta[i].key, o->meta[i].value);
  }
  bool ok = !p->head.failed && !p->graph_head.failed && !p->graph_tail.failed && !p->tail.failed;

  uint64_t graph = p->graph_head.size + p->graph_tail.size, offset = 0;
  for (size_t i = 0; i < o->n_inits && ok; i++) {
    struct init *t = &o->inits[i];
    const char *file = data_file_of(t, data_name);
    p->any_external = p->any_external || file != NULL;
    t->offset = (offset + EXTERNAL_ALIGN - 1) / EXTERNAL_ALIGN * EXTERNAL_ALIGN;
    uint64_t size;
    ok = tensor_size(t, file, &size) &&
         (file == NULL || npu_add_u64(t->offset, t->nbytes, &offset)) &&
         npu_add_u64(p->data_size, t->nbytes, &p->data_size) &&
         npu_add_u64(graph, 1 + varint_size(size) + size, &graph);
  }
  p->graph_size = graph;
  ok = ok &&
       npu_add_u64(p->head.size + p->tail.size, 1 + varint_size(graph) + graph, &p->model_size);
  if (ok) return NPULM_OK;
  plan_free(p);
  return npu_fail(err, NPULM_ERR_NOMEM, "out of memory encoding ONNX graph '%s'", o->graph_name);
}

/* Where bytes go: a file written whole or not at all, or a memory buffer. */
struct sink {
  struct npu_afile *file;
  struct npu_gguf_buf *mem;
  const struct npu_onnx_write_options *opts; /* progress */
  uint64_t done, total;                      /* initializer bytes */
};

static npulm_status sink_put(struct sink *s, const void *data, size_t n, npulm_error *err) {
  if (s->file != NULL) return npu_afile_write(s->file, data, n, err);
  npu_gguf_buf_put(s->mem, data, n);
  if (s->mem->failed) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory writing an ONNX model");
  return NPULM_OK;
}

static npulm_status sink_put_buf(struct sink *s, const struct npu_gguf_buf *b, npulm_error *err) {
  return sink_put(s, b->data, b->size, err);
}

/* Initializer 't''s bytes: copied ones as they are, a lazy one's made by its fill() in a buffer
 * of its own, freed once written, so that one at most is in memory. */
static npulm_status put_init_bytes(struct sink *s, struct init *t, npulm_error *err) {
  uint8_t *made = NULL;
  if (t->data == NULL) {
    made = malloc((size_t)t->nbytes); /* malloc's alignment suits any element type */
    if (made == NULL) {
      return npu_fail(err, NPULM_ERR_NOMEM, "out of memory making ONNX initializer '%s'", t->name);
    }
    if (!t->fill(t->user, made)) {
      free(made);
      return npu_fail(err, NPULM_ERR_ARG, "ONNX initializer '%s': its bytes could not be made",
                      t->name);
    }
  }
  const void *bytes = made != NULL ? made : t->data;
  t->digest = XXH3_64bits(bytes, (size_t)t->nbytes);
  npulm_status st = sink_put(s, bytes, (size_t)t->nbytes, err);
  free(made);
  s->done += t->nbytes;
  if (st == NPULM_OK && s->opts != NULL && s->opts->progress != NULL) {
    s->opts->progress(s->opts->progress_user, s->done, s->total);
  }
  return st;
}

uint64_t npu_onnx_initializers_digest(const struct npu_onnx *o) {
  XXH3_state_t *state = XXH3_createState();
  if (state == NULL) return 0;
  XXH3_64bits_reset(state);
  for (size_t i = 0; i < o->n_inits; i++) {
    uint8_t le[8];
    for (int b = 0; b < 8; b++) le[b] = (uint8_t)(o->inits[i].digest >> (8 * b));
    XXH3_64bits_update(state, le, sizeof(le));
  }
  const uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return digest;
}

/* The model file's bytes. */
static npulm_status put_model(struct npu_onnx *o, const struct plan *p, struct sink *s,
                              npulm_error *err) {
  struct npu_gguf_buf graph_tag = {0};
  pb_len(&graph_tag, MODEL_GRAPH, p->graph_size);
  if (graph_tag.failed) {
    npu_gguf_buf_free(&graph_tag);
    goto nomem;
  }
  npulm_status st = sink_put_buf(s, &p->head, err);
  if (st == NPULM_OK) st = sink_put_buf(s, &graph_tag, err);
  npu_gguf_buf_free(&graph_tag);
  if (st == NPULM_OK) st = sink_put_buf(s, &p->graph_head, err);
  for (size_t i = 0; i < o->n_inits && st == NPULM_OK; i++) {
    struct init *t = &o->inits[i];
    struct npu_gguf_buf tensor_head = {0};
    uint64_t size;
    const char *file = data_file_of(t, p->data_name);
    if (!tensor_size(t, file, &size)) goto nomem;
    pb_len(&tensor_head, GRAPH_INITIALIZER, size);
    put_tensor_head(&tensor_head, t, file);
    st = tensor_head.failed ? NPULM_ERR_NOMEM : sink_put_buf(s, &tensor_head, err);
    npu_gguf_buf_free(&tensor_head);
    if (st == NPULM_ERR_NOMEM) goto nomem;
    if (st == NPULM_OK && file == NULL) st = put_init_bytes(s, t, err);
  }
  if (st == NPULM_OK) st = sink_put_buf(s, &p->graph_tail, err);
  if (st == NPULM_OK) st = sink_put_buf(s, &p->tail, err);
  if (st == NPULM_OK && s->opts != NULL && s->opts->checksum_key != NULL) {
    /* last, once every initializer's bytes are written (a ModelProto's fields may come in any
     * order, and a repeated one's entries add up) */
    struct npu_gguf_buf entry = {0};
    char hex[17];
    snprintf(hex, sizeof(hex), "%016" PRIx64, npu_onnx_initializers_digest(o));
    put_string_entry(&entry, MODEL_METADATA_PROPS, s->opts->checksum_key, hex);
    st = entry.failed ? NPULM_ERR_NOMEM : sink_put_buf(s, &entry, err);
    npu_gguf_buf_free(&entry);
    if (st == NPULM_ERR_NOMEM) goto nomem;
  }
  return st;
nomem:
  return npu_fail(err, NPULM_ERR_NOMEM, "out of memory writing ONNX graph '%s'", o->graph_name);
}

/* The data file of an external write: each initializer's bytes at its offset. */
static npulm_status write_data_file(struct npu_onnx *o, const char *data_path,
                                    const char *data_name, struct sink *s, npulm_error *err) {
  static const uint8_t zeros[EXTERNAL_ALIGN];
  struct npu_afile file = {0};
  npulm_status st = npu_afile_open(data_path, &file, err);
  if (st != NPULM_OK) return st;
  s->file = &file;
  uint64_t at = 0;
  for (size_t i = 0; i < o->n_inits && st == NPULM_OK; i++) {
    struct init *t = &o->inits[i];
    if (data_file_of(t, data_name) == NULL) continue;
    st = sink_put(s, zeros, (size_t)(t->offset - at), err);
    if (st == NPULM_OK) st = put_init_bytes(s, t, err);
    at = t->offset + t->nbytes;
  }
  s->file = NULL;
  if (st != NPULM_OK) {
    npu_afile_abort(&file);
    return st;
  }
  return npu_afile_commit(&file, err);
}

/* Refuse a model that is not well formed (see onnx_write.h). */
static npulm_status check_model(const struct npu_onnx *o, npulm_error *err) {
  if (o->status != NPULM_OK) return npu_onnx_status(o, err);
  for (size_t i = 0; i < o->n_outputs; i++) {
    if (!set_has(&o->defined, o->outputs[i].name)) {
      return npu_fail(err, NPULM_ERR_ARG, "ONNX graph output '%s' is not defined",
                      o->outputs[i].name);
    }
  }
  return NPULM_OK;
}

npulm_status npu_onnx_write(struct npu_onnx *o, const char *path,
                            const struct npu_onnx_write_options *opts, bool *external_out,
                            npulm_error *err) {
  if (external_out != NULL) *external_out = false;
  npulm_status st = check_model(o, err);
  if (st != NPULM_OK) return st;
  size_t path_len = strlen(path);
  char *data_path = malloc(path_len + sizeof(".data"));
  if (data_path == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory writing '%s'", path);
  memcpy(data_path, path, path_len);
  memcpy(data_path + path_len, ".data", sizeof(".data"));
  const char *slash = strrchr(data_path, '/');
  const char *data_name = slash != NULL ? slash + 1 : data_path;

  struct plan p;
  bool external = opts != NULL && opts->external;
  st = make_plan(o, external ? data_name : NULL, &p, err);
  if (st == NPULM_OK && !external && p.model_size > PROTOBUF_MAX_BYTES) {
    plan_free(&p);
    external = true;
    st = make_plan(o, data_name, &p, err);
  }
  if (st != NPULM_OK) {
    free(data_path);
    return st;
  }
  struct sink s = {.opts = opts, .total = p.data_size};
  bool data_committed = false;
  if (p.model_size > PROTOBUF_MAX_BYTES) {
    st = npu_fail(err, NPULM_ERR_UNSUPPORTED, "ONNX graph '%s' passes protobuf's 2 GiB limit",
                  o->graph_name);
  } else if (p.any_external) { /* no data file when every initializer is small */
    st = write_data_file(o, data_path, data_name, &s, err);
    data_committed = st == NPULM_OK;
  }
  struct npu_afile file = {0};
  if (st == NPULM_OK) st = npu_afile_open(path, &file, err);
  if (st == NPULM_OK) {
    s.file = &file;
    st = put_model(o, &p, &s, err);
    if (st == NPULM_OK) {
      st = npu_afile_commit(&file, err);
    } else {
      npu_afile_abort(&file);
    }
  }
  /* a data file without its model is no half of a pair to leave behind */
  if (st != NPULM_OK && p.any_external && data_committed) unlink(data_path);
  plan_free(&p);
  free(data_path);
  if (st == NPULM_OK && external_out != NULL) *external_out = external;
  return st;
}

npulm_status npu_onnx_write_mem(struct npu_onnx *o, uint8_t **data_out, size_t *size_out,
                                npulm_error *err) {
  *data_out = NULL;
  *size_out = 0;
  npulm_status st = check_model(o, err);
  struct plan p;
  if (st == NPULM_OK) st = make_plan(o, NULL, &p, err);
  if (st != NPULM_OK) return st;
  struct npu_gguf_buf mem = {0};
  struct sink s = {.mem = &mem, .total = p.data_size};
  if (p.model_size > PROTOBUF_MAX_BYTES) {
    st = npu_fail(err, NPULM_ERR_UNSUPPORTED,
                  "ONNX graph '%s' passes protobuf's 2 GiB limit (write it to a file)",
                  o->graph_name);
  } else {
    st = put_model(o, &p, &s, err);
  }
  plan_free(&p);
  if (st != NPULM_OK) {
    npu_gguf_buf_free(&mem);
    return st;
  }
  *data_out = mem.data;
  *size_out = mem.size;
  return NPULM_OK;
}
