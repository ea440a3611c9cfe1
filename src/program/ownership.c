/* Who owns what in a program: freeing it and its integer data, placing its packed weights for
 * running, and linking each graph's nodes to their integer data (see program.h). */
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/pages.h"
#include "program/program.h"
#include "program/sparse_data.h"

void npu_program_free(struct npu_program *p) {
  if (p == NULL) return;
  npu_quant_free(p);
  free(p->streamed);
  free(p->smooth_alphas);
  for (int32_t i = 0; p->smooth_factors != NULL && i < p->n_smooth_factors; i++) {
    free(p->smooth_factors[i]);
  }
  free(p->smooth_factors);
  for (int32_t i = 0; i < p->n_graphs; i++) npu_graph_free(&p->graphs[i]);
  free(p->graphs);
  free(p->weights);
  free(p);
}

/* Whether 'packed' lies in the program's block of placed weights. */
static bool in_arena(const struct npu_program *p, const void *packed) {
  const uint8_t *b = packed;
  return p->packed_arena != NULL && b >= p->packed_arena &&
         b < p->packed_arena + p->packed_arena_size;
}

/* Free a site's arrays; 'packed' only when it is its own heap memory (not a program file's
 * mapping, nor the placed weights' block, nor the matmul's whose weights a gather reads). */
static void free_site(const struct npu_program *p, struct npu_qsite *s) {
  if (!p->qsites_mapped && s->table_site < 0 && !in_arena(p, s->packed)) free(s->packed);
  free(s->mult);
  free(s->shift);
  free(s->outliers);
  free(s->outlier_w);
  free(s->outlier_gate);
  free(s->outlier_up);
}

void npu_quant_free(struct npu_program *p) {
  for (int32_t i = 0; i < p->n_qsites; i++) free_site(p, &p->qsites[i]);
  npu_pages_free(p->packed_arena, p->packed_arena_size);
  p->packed_arena = NULL;
  p->packed_arena_size = 0;
  npu_pages_free(p->spill, p->spill_size);
  p->spill = NULL;
  p->spill_size = p->spill_used = 0;
  free(p->qsites);
  free(p->qtensors);
  for (int32_t i = 0; i < p->n_owned; i++) free(p->owned[i]);
  free(p->owned);
  p->qsites = NULL;
  p->qtensors = NULL;
  p->owned = NULL;
  p->n_qsites = p->n_qtensors = p->n_owned = 0;
  p->quant_mode = NPU_QUANT_F32;
  p->qsites_mapped = false;
  npu_sparse_free(p->sparse); /* built on the integer data */
  p->sparse = NULL;
}

/* Whether site 's' is a matmul whose packed weights are its own (placed in the arena). */
static bool placed(const struct npu_qsite *s) {
  return s->op == NPU_OP_MATMUL && s->table_site < 0 && s->packed != NULL;
}

npulm_status npu_quant_place_packed(struct npu_program *p, npulm_error *err) {
  return npu_quant_place_packed_but(p, NULL, err);
}

npulm_status npu_quant_place_packed_but(struct npu_program *p, const uint8_t *leave,
                                        npulm_error *err) {
  enum { ALIGN = 64 };
  size_t total = 0;
  for (int32_t i = 0; i < p->n_qsites; i++) {
    const struct npu_qsite *s = &p->qsites[i];
    if (placed(s) && (leave == NULL || !leave[i]))
      total += ((size_t)s->packed_size + ALIGN - 1) / ALIGN * ALIGN;
  }
  if (total == 0 || p->packed_arena != NULL) return NPULM_OK;
  /* under a budget (some sites left in the file) small pages: a huge page's rounding would count
   * against it */
  uint8_t *arena = leave != NULL ? npu_pages_alloc(total) : npu_pages_alloc_huge(total);
  if (arena == NULL) {
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory placing %zu MiB of packed weights",
                    total >> 20);
  }
  size_t off = 0;
  for (int32_t i = 0; i < p->n_qsites; i++) {
    struct npu_qsite *s = &p->qsites[i];
    if (!placed(s) || (leave != NULL && leave[i])) continue;
    memcpy(arena + off, s->packed, (size_t)s->packed_size);
    if (p->qsites_mapped) npu_pages_release(s->packed, (size_t)s->packed_size);
    else free(s->packed);
    s->packed = arena + off;
    off += ((size_t)s->packed_size + ALIGN - 1) / ALIGN * ALIGN;
  }
  p->packed_arena = arena;
  p->packed_arena_size = total;
  for (int32_t i = 0; i < p->n_qsites; i++) {
    struct npu_qsite *s = &p->qsites[i];
    if (s->table_site >= 0) s->packed = p->qsites[s->table_site].packed;
  }
  return NPULM_OK;
}

uint64_t npu_matmul_rows_packed_size(const struct npu_qsite *s, size_t rows, size_t cols) {
  if (s->w_bits == 8 && s->w_block == 0) return npu_qs8_gemm_packed_size(rows, cols);
  if (s->w_bits == 4 && (s->w_block == 0 || s->w_block == NPU_QC4W_BLOCK)) {
    return npu_qc4w_gemm_packed_size(rows, cols, s->w_block);
  }
  return 0;
}

uint64_t npu_matmul_packed_size(const struct npu_qsite *s) {
  return npu_matmul_rows_packed_size(s, (size_t)s->n, (size_t)s->k);
}

/* The matmul whose outlier channels SHADOW node 'i' computes: the one whose output the shadow's
 * sum (an ADD of it and the TRANSFER of node i's output) reads; -1 if there is none. */
static int32_t shadowed_matmul(const struct npu_graph *g, int32_t i) {
  int32_t copy = npu_ir_reader_of(g, g->nodes[i].out, i + 1);
  if (copy < 0 || g->nodes[copy].op != NPU_OP_TRANSFER) return -1;
  int32_t sum = npu_ir_reader_of(g, g->nodes[copy].out, copy + 1);
  if (sum < 0 || g->nodes[sum].op != NPU_OP_ADD) return -1;
  return npu_ir_writer_of(g, g->nodes[sum].in[0]);
}

npulm_status npu_quant_link(const struct npu_program *p, struct npu_graph *g, npulm_error *err) {
  free(g->node_site);
  g->node_site = malloc((size_t)(g->n_nodes > 0 ? g->n_nodes : 1) * sizeof(int32_t));
  if (g->node_site == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const struct npu_ir_node *n = &g->nodes[i];
    g->node_site[i] = -1;
    /* the node whose output names the data: this one, or for a shadow its matmul */
    int32_t named = i;
    if (n->op == NPU_OP_SHADOW) {
      named = shadowed_matmul(g, i);
    } else if (n->backend != NPU_BE_NPU) {
      continue;
    }
    const struct npu_qsite *site =
        named >= 0 ? npu_program_qsite(p, g->tensors[g->nodes[named].out].name) : NULL;
    enum npu_op want = n->op == NPU_OP_SHADOW ? NPU_OP_MATMUL : (enum npu_op)n->op;
    if (site == NULL || site->op != want) {
      return npu_fail(err, NPULM_ERR_FORMAT, "NPU node writing '%.*s' has no integer data",
                      NPU_IR_NAME_MAX, g->tensors[n->out].name);
    }
    g->node_site[i] = (int32_t)(site - p->qsites);
  }
  return NPULM_OK;
}
