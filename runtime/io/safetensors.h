/* The safetensors engine that the weights-only saves and loads
 * (safetensors.c) and the training checkpoints (checkpoint.c) share: a
 * list of named F32 tensors of a compiled graph, saved whole or not at all,
 * and loaded with every check made before any tensor changes. */
#ifndef REMAT_RUNTIME_SAFETENSORS_H
#define REMAT_RUNTIME_SAFETENSORS_H

#include <cjson/cJSON.h>

#include "runtime/internal.h"

/* A checkpoint holds AdamW's moments of parameter P as "adam_m:P" and
 * "adam_v:P", and marks itself with this __metadata__ key; a weights-only
 * load of a checkpoint skips the moments. */
#define SAFET_ADAM_M "adam_m:"
#define SAFET_ADAM_V "adam_v:"
#define SAFET_CHECKPOINT_KEY "remat.checkpoint"

/* One tensor of a file: its name, the parameter whose shape it has, and
 * its values in the compiled step, of element type `store`: f32 (0, the
 * default), or bf16 for a frozen parameter stored in bf16, which a save
 * widens to F32 and a load rounds into. */
typedef struct safet_item {
  char name[REMAT__NAME_MAX + 8];
  const remat_tensor *param;
  void *data;
  op_dtype store;
  bool transpose; /* a load: the file holds the 2-D parameter transposed
                     ([in,out], as GPT-2's Conv1D stores it) */
  bool save_bf16; /* a save: written as BF16 (rounded to nearest even) */
  bool optional; /* a load may find it absent (a LoRA adapter in a base
                    model's file): it keeps its values */
} safet_item;

/* One __metadata__ entry (safetensors metadata values are strings). */
typedef struct safet_meta {
  const char *key;
  char value[32];
} safet_meta;

/* What a load reads. */
typedef struct safet_load_req {
  const char *what;   /* the public call, for messages */
  safet_item *items;
  int nitems;
  bool weights_only;  /* skip a checkpoint's optimizer state */
  const char *prefix; /* a prefix a file's names may carry ("transformer."),
                         dropped before matching; NULL none */
  bool (*ignored)(const char *name); /* a file's tensors (after the prefix)
                                        that no item takes; NULL none */
} safet_load_req;

/* A load in progress (safetensors.c). */
typedef struct safet_loading safet_loading;

/* Checks the arguments and enters the compiled graph for the whole call
 * (so no step of another thread lands between a load's checks and its
 * writes); safet_release leaves it. */
remat_status safet_hold(remat_graph *g, const char *path, const char *what);
void safet_release(remat_graph *g);
/* The parameters in creation order (their values), or the trainable ones
 * (their gradients: a frozen parameter has none), in a new array with room
 * for `extra` more items; *n is set to the number of items. */
remat_status safet_params(remat_graph *g, bool grads, int extra,
                          safet_item **items, int *n, const char *what);
/* Writes the items (names unique and not "__metadata__", checked first)
 * and the metadata to a new file that replaces `path`. */
remat_status safet_save(remat_graph *g, const char *path,
                        const safet_item *items, int nitems,
                        const safet_meta *meta, int nmeta, const char *what);
/* A load in three calls, so that the caller checks the metadata between
 * reading the header and touching any tensor: safet_load_open opens the
 * file at `path` and reads its header (*meta: its __metadata__, NULL when
 * it has none, valid until the close); safet_load_read checks every entry
 * against the request's items and then reads them all, or changes none;
 * safet_load_close (after either, also on failure; NULL is fine) closes
 * and frees. *out is set even when the open fails. */
remat_status safet_load_open(const char *path, const safet_load_req *req,
                             safet_loading **out, const cJSON **meta);
remat_status safet_load_read(safet_loading *ld);
/* Reads the header of the file at `path` alone, checked as a load checks
 * it: *root (for the caller to cJSON_Delete, NULL on failure) and *meta,
 * its __metadata__ (NULL when it has none). */
remat_status safet_read_header(const char *path, const char *what,
                               cJSON **root, const cJSON **meta);

void safet_load_close(safet_loading *ld);

/* A weights-only load of every parameter from `path` (a file, or a
 * sharded checkpoint's index when it ends in ".json") for the public call
 * `what`: `rename` (NULL: none) gives each item the name and layout it has
 * in the file, or fails naming the parameter; `prefix` and `ignored` as in
 * safet_load_req. All or nothing. */
remat_status safet_load_weights(remat_graph *g, const char *path,
                                const char *what,
                                remat_status (*rename)(safet_item *items,
                                                       int n, const char *what),
                                const char *prefix,
                                bool (*ignored)(const char *name));

#endif
