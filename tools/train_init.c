/* remat-train --init DIR: a pre-trained model's config.json and weights
 * (tools/hf_init.c) as the model a run builds, loads and saves; the run
 * itself (data, steps, evaluation, sampling) is the same as for remat's
 * own GPT. */
#include <stdlib.h>

#include "tools/train.h"

int init_prepare(train_options *o, char *err, size_t err_len) {
  static hf_model model; /* one per process, read once */
  if (hf_read(o->init_dir, &model, err, err_len) != 0)
    return EXIT_RUNTIME;
  o->init = &model;
  o->vocab = model.vocab;
  o->data_u16 = 1; /* token ids, whatever their width */
  o->tokens_only = o->data_path == NULL;
  if (model.positions > 0 && o->cfg.seq > model.positions) {
    snprintf(err, err_len,
             "--seq %d is more than the %d positions of --init's model (%s)",
             o->cfg.seq, model.positions,
             model.gpt2 ? "n_positions" : "max_position_embeddings");
    return EXIT_USAGE;
  }
  return 0;
}

int init_read(train_options *o) {
  if (o->init_dir == NULL)
    return 0;
  char err[512];
  int rc = init_prepare(o, err, sizeof err);
  if (rc != 0)
    fprintf(stderr, "remat-train: %s\n", err);
  return rc;
}

remat_status train_build(remat_graph *g, const train_options *o, int batch,
                         remat_gpt *m) {
  if (o->init != NULL)
    return hf_build(g, o->init, o->cfg.seq, batch, o->cfg.attention,
                    &o->cfg.lora, m);
  return lora_model_build(g, o, batch, m);
}

remat_status train_load(remat_graph *g, const train_options *o) {
  if (o->load_path != NULL)
    return remat_load_safetensors(g, o->load_path);
  if (o->init != NULL)
    return hf_load(g, o->init);
  return REMAT_OK;
}

remat_status init_save(remat_graph *g, const train_options *o) {
  return o->save_bf16 ? remat_save_safetensors_bf16(g, o->save_path)
                      : remat_save_safetensors(g, o->save_path);
}
