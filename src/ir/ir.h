/* The graph IR: static-shape graphs of typed tensors and ops, one per specialization (a prefill
 * chunk of C tokens or decode, times a context bucket K). A graph is built once, partitioned
 * (each op on the NPU or the CPU backend), planned (every activation at a fixed arena offset) and
 * then only executed. Everything in it is plain data, so it serializes into the program file. */
#ifndef NPU_IR_IR_H
#define NPU_IR_IR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "npulm.h"

enum npu_dtype { NPU_DT_F32, NPU_DT_I8, NPU_DT_I16, NPU_DT_I32, NPU_DT_COUNT };

enum npu_backend { NPU_BE_NPU, NPU_BE_CPU, NPU_BE_COUNT };

/* Operators: one row each in ir/ops.inc, which gives their shapes and inputs. */
enum npu_op {
#define NPU_OP(id, name, where, rows, sites, cost) NPU_OP_##id,
#include "ir/ops.inc"
#undef NPU_OP
  NPU_OP_COUNT
};

/* The parts of a node's integer data (struct npu_qsite) an op uses (the 'sites' column of
 * ir/ops.inc). */
enum npu_site_group {
  NPU_SITE_N = 1u << 0,        /* n: output channels (matmul), rows (gather), width (rmsnorm) */
  NPU_SITE_TABLE = 1u << 1,    /* k and the int8 table [n, k] with its per-row mult and shift */
  NPU_SITE_OUTLIERS = 1u << 2, /* shadow outlier channels: n_outliers, outlier_dim, their arrays */
  NPU_SITE_GEMM = 1u << 3,     /* gemm */
  NPU_SITE_GATHER = 1u << 4,   /* gather */
  NPU_SITE_ADD = 1u << 5,      /* add */
  NPU_SITE_MUL = 1u << 6,      /* mul */
  NPU_SITE_LUT = 1u << 7,      /* lut: a table of 256 int8 values */
  NPU_SITE_QK = 1u << 8,       /* qk */
  NPU_SITE_SOFTMAX = 1u << 9,  /* softmax */
  NPU_SITE_PV = 1u << 10,      /* pv */
  NPU_SITE_RMSNORM = 1u << 11, /* rmsnorm, with its per-channel multipliers in mult */
};

/* How the cost model counts an op (the 'cost' column of ir/ops.inc). */
enum npu_op_cost {
  NPU_COST_ARITHMETIC,  /* a product (matmul, attention): its MACs are the run's MACs */
  NPU_COST_ELEMENTWISE, /* one operation per output element, nothing read but its activations */
  NPU_COST_OWN,         /* its own formula in the cost model */
};

/* One row of ir/ops.inc. */
struct npu_op_info {
  const char *name;
  bool on_npu;    /* the emulated NPU has an integer kernel for it */
  bool rowwise;   /* on the NPU, rows may be cut into ranges run on different threads */
  uint32_t sites; /* enum npu_site_group bits: its integer data; 0 if it has no site */
  enum npu_op_cost cost;
};

enum npu_tensor_kind {
  NPU_TK_ACT,       /* activation: lives in its backend's arena at 'offset' */
  NPU_TK_WEIGHT,    /* model weight number 'ref' (see npu_program weights) */
  NPU_TK_INPUT_IDS, /* the step's token ids, [rows] int32 */
  NPU_TK_KV,        /* KV cache of layer 'ref': K when 'kv_is_value' is false, else V */
  NPU_TK_LOGITS,    /* the step's output, [rows, n_vocab] f32 (a graph for generation: [1,
                       n_vocab], the last real row's), in the caller's buffer */
};

/* Quantization parameters of a tensor: a slot the integer NPU fills in; unused while the graph
 * computes in FP32. */
struct npu_qparams {
  float scale;
  int32_t zero_point;
};

#define NPU_IR_NAME_MAX 40

struct npu_ir_tensor {
  uint8_t kind;    /* enum npu_tensor_kind */
  uint8_t dtype;   /* enum npu_dtype */
  uint8_t backend; /* enum npu_backend: whose arena holds it (ACT) */
  uint8_t kv_is_value;
  int32_t ne[3];   /* [rows, cols, 1] or [heads, rows, K] */
  int32_t ref;     /* weight number (WEIGHT) or layer (KV); -1 otherwise */
  int32_t layer;   /* the transformer block it belongs to; -1 outside them (and for weights) */
  uint8_t role;    /* enum npu_tensor_role: what it holds, for passes to find it by */
  uint64_t offset; /* byte offset in the backend arena (ACT), set by the planner */
  struct npu_qparams q;
  char name[NPU_IR_NAME_MAX]; /* e.g. "blk.3.attn_q": for inspect and error attribution */
};

#define NPU_IR_MAX_IN 3

struct npu_ir_node {
  uint8_t op;      /* enum npu_op */
  uint8_t backend; /* enum npu_backend, set by the partitioner */
  uint8_t pinned;  /* nonzero: the precision policy keeps this op in float on the CPU */
  uint8_t pad;
  int32_t in[NPU_IR_MAX_IN];
  int32_t out;
  int32_t layer; /* -1 outside the transformer blocks */
  float param;   /* rmsnorm eps; attention scale for QK and ATTN; 0 otherwise */
};

/* A run of consecutive nodes on one backend. */
struct npu_subgraph {
  int32_t first;
  int32_t count;
  int32_t backend;
};

/* One specialization: 'rows' tokens per step (1 = decode) attending over a context bucket of 'ctx'
 * cache positions. */
struct npu_graph {
  int32_t rows;
  int32_t ctx;
  int32_t n_tensors, n_nodes, n_subgraphs;
  struct npu_ir_tensor *tensors;
  struct npu_ir_node *nodes;
  struct npu_subgraph *subgraphs;
  uint64_t arena_size[NPU_BE_COUNT]; /* bytes, set by the planner */
  int32_t n_transfers;               /* backend switches (TRANSFER nodes) */
  int32_t *node_site; /* (n_nodes) integer data of each NPU node: an index into the program's
                         qsites, or -1; derived from the names (a SHADOW node's from its
                         matmul's) when a program is quantized or loaded (not stored), NULL for
                         FP32 programs */
};

/* The row of 'op' (< NPU_OP_COUNT) in ir/ops.inc. */
const struct npu_op_info *npu_op_info(enum npu_op op);

/* The name of 'op', or "?" for a value outside the enum. */
const char *npu_op_name(enum npu_op op);

/* Rows of the graph's logits: g->rows, or 1 for a graph that computes only the last real row's
 * (NPU_OP_LAST_ROW before the output head). */
int32_t npu_graph_logit_rows(const struct npu_graph *g);
const char *npu_backend_name(enum npu_backend be);
size_t npu_dtype_size(enum npu_dtype dt);

/* Bytes of tensor 't' (product of its shape times its dtype size). */
uint64_t npu_ir_tensor_bytes(const struct npu_ir_tensor *t);

/* Graph construction. Every add validates its arguments (ids in range, shapes that agree) and
 * returns the new id, or -1 after recording the problem in the builder. */
struct npu_ir_builder {
  struct npu_graph *g;
  int32_t cap_tensors, cap_nodes, cap_subgraphs; /* node_site, when present, has cap_nodes */
  npulm_status status;
  npulm_error err;
};

void npu_ir_builder_init(struct npu_ir_builder *b, struct npu_graph *g, int32_t rows, int32_t ctx);
int32_t npu_ir_add_tensor(struct npu_ir_builder *b, enum npu_tensor_kind kind, enum npu_dtype dt,
                          int32_t ne0, int32_t ne1, int32_t ne2, int32_t ref, const char *name);
int32_t npu_ir_add_node(struct npu_ir_builder *b, enum npu_op op, int32_t in0, int32_t in1,
                        int32_t in2, int32_t out, int32_t layer, float param);

/* Check a whole graph (after loading it from a file, say): every id, kind, dtype and shape, and
 * that each activation is written before it is read. */
npulm_status npu_ir_validate(const struct npu_graph *g, int32_t n_weights, int32_t n_layers,
                             npulm_error *err);

void npu_graph_free(struct npu_graph *g); /* frees the arrays; accepts NULL */

/* ---- Tensor roles and graph editing for passes ------------------------------------------------
 * Passes (the partitioner, the quantizer) find a tensor by what it holds, its role in a layer,
 * rather than by its name; names key the quantization sites and calibration statistics and are
 * shown to users. Copies of a value in the other arena (TRANSFER outputs) keep its role and layer.
 * The numbering is stored in program files. */
enum npu_tensor_role {
  NPU_ROLE_NONE,      /* weights, token ids */
  NPU_ROLE_EMBD,      /* the token embeddings, the residual stream entering block 0 */
  NPU_ROLE_ATTN_NORM, /* per layer, in data-flow order: */
  NPU_ROLE_Q,
  NPU_ROLE_K,
  NPU_ROLE_V,
  NPU_ROLE_Q_ROPE,
  NPU_ROLE_K_ROPE,
  NPU_ROLE_K_CACHE, /* the layer's KV caches (KV tensors) */
  NPU_ROLE_V_CACHE,
  NPU_ROLE_KQ,         /* attention scores */
  NPU_ROLE_KQ_SOFTMAX, /* attention probabilities */
  NPU_ROLE_KQV,        /* attention output, the input of the output projection */
  NPU_ROLE_ATTN_OUT,
  NPU_ROLE_ATTN_RESIDUAL,
  NPU_ROLE_FFN_NORM,
  NPU_ROLE_FFN_GATE,
  NPU_ROLE_FFN_UP,
  NPU_ROLE_FFN_SILU,
  NPU_ROLE_FFN_GATE_PAR, /* silu(gate) * up, the input of the down projection */
  NPU_ROLE_FFN_DOWN,
  NPU_ROLE_FFN_RESIDUAL, /* the residual stream leaving the block */
  NPU_ROLE_LAST_ROW,     /* the last real row of the residual stream (graphs for generation) */
  NPU_ROLE_OUTPUT_NORM,
  NPU_ROLE_LOGITS,
  NPU_ROLE_K_CACHE_COPY, /* the integer NPU's int8 copy of a K (V) cache (quantizer) */
  NPU_ROLE_V_CACHE_COPY,
  NPU_ROLE_SHADOW,     /* a shadowed matmul's outlier share, on the CPU or its NPU copy */
  NPU_ROLE_SHADOW_SUM, /* a shadowed matmul's result plus its outlier share */
  NPU_ROLE_COUNT
};

/* What a role's tensor is called: the builder names a layer's tensor "blk.L.<this>". */
const char *npu_tensor_role_name(enum npu_tensor_role role);

/* Give tensor 't' its layer and role (or record a bad id or role in the builder). */
void npu_ir_set_role(struct npu_ir_builder *b, int32_t t, int32_t layer, enum npu_tensor_role role);

/* Reopen graph 'g' (built, partitioned, planned or loaded) for a pass to edit through 'b': adds
 * append to its arrays, growing them as the builder does. */
void npu_ir_builder_resume(struct npu_ir_builder *b, struct npu_graph *g);

/* The builder's status: NPULM_OK, or the first failure, copied to '*err'. */
npulm_status npu_ir_builder_status(const struct npu_ir_builder *b, npulm_error *err);

/* A new activation in backend 'be's arena with tensor 'like's dtype, shape, layer, role, which
 * cache it holds (kv_is_value) and quantization, named 'name' (NULL: like's name); returns its
 * id, or -1. */
int32_t npu_ir_add_copy(struct npu_ir_builder *b, int32_t like, enum npu_backend be,
                        const char *name);

/* Insert node 'node' at index 'at' (0 .. n_nodes): the nodes from 'at' on move one up, as do
 * their integer data links (node_site, the new node's -1); subgraphs, if the graph has them, are
 * cut again. Validated as npu_ir_add_node; returns 'at', or -1. */
int32_t npu_ir_insert_node(struct npu_ir_builder *b, int32_t at, const struct npu_ir_node *node);

/* Cut the node list into subgraphs, maximal runs of nodes on one backend. */
void npu_ir_cut_subgraphs(struct npu_ir_builder *b);

/* The first tensor of 'role' in 'layer' (-1: outside the blocks), the one its op writes (copies
 * come after it), or -1 if the graph has none. */
int32_t npu_ir_find_tensor(const struct npu_graph *g, int32_t layer, enum npu_tensor_role role);

/* The node that writes tensor 't', or -1 (weights, token ids, a KV cache read before written). */
int32_t npu_ir_writer_of(const struct npu_graph *g, int32_t t);

/* The weight (slot 1) or bias (slot 2) that the op writing the tensor of 'role' in 'layer' reads:
 * its number in the program's weight table (the tensor's ref), or -1. */
int32_t npu_ir_weight_of(const struct npu_graph *g, int32_t layer, enum npu_tensor_role role,
                         int slot);

/* The first node from index 'from' on that reads tensor 't', or -1. */
int32_t npu_ir_reader_of(const struct npu_graph *g, int32_t t, int32_t from);

/* Tensor 't's value in backend 'be's arena: 't' itself, the tensor a TRANSFER copied it from, or
 * a TRANSFER's copy of it; -1 if the value has no tensor there. */
int32_t npu_ir_value_on(const struct npu_graph *g, int32_t t, enum npu_backend be);

#endif /* NPU_IR_IR_H */
