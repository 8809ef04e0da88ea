/* Reading a Hugging Face model directory (config.json through cJSON, and
 * where its weights are), then building the model it describes and loading
 * its weights. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tools/hf_init.h"

/* What a JSON value is, for a message about a field of the wrong type. */
static const char *json_kind(const cJSON *v) {
  if (cJSON_IsString(v))
    return "a string";
  if (cJSON_IsBool(v))
    return "a boolean";
  if (cJSON_IsNull(v))
    return "null";
  if (cJSON_IsArray(v))
    return "an array";
  if (cJSON_IsObject(v))
    return "an object";
  return "a number";
}

/* Field `name` of the config: a whole number from min to max. `dflt`
 * (>= 0) is taken when it is missing; else a missing field fails. */
static int int_field(const cJSON *root, const char *name, int min, int max,
                     int dflt, int *out, char *err, size_t len) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
  if (v == NULL && dflt >= 0) {
    *out = dflt;
    return 0;
  }
  if (v == NULL)
    snprintf(err, len, "config.json: %s is missing", name);
  else if (!cJSON_IsNumber(v))
    snprintf(err, len,
             "config.json: %s is %s: expected a whole number from "
             "%d to %d",
             name, json_kind(v), min, max);
  else if (v->valuedouble != floor(v->valuedouble) || v->valuedouble < min ||
           v->valuedouble > max)
    snprintf(err, len,
             "config.json: %s %.17g: expected a whole number from "
             "%d to %d",
             name, v->valuedouble, min, max);
  else {
    *out = (int)v->valuedouble;
    return 0;
  }
  return -1;
}

/* Field `name`: a number in (0, max]; `dflt` when missing. */
static int float_field(const cJSON *root, const char *name, double max,
                       float dflt, float *out, char *err, size_t len) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
  if (v == NULL) {
    *out = dflt;
    return 0;
  }
  if (!cJSON_IsNumber(v))
    snprintf(err, len,
             "config.json: %s is %s: expected a number above 0 "
             "and at most %g",
             name, json_kind(v), max);
  else if (!(v->valuedouble > 0 && v->valuedouble <= max))
    snprintf(err, len,
             "config.json: %s %g: expected a number above 0 "
             "and at most %g",
             name, v->valuedouble, max);
  else if ((float)v->valuedouble == 0.0f) /* checked as the f32 it becomes */
    snprintf(err, len,
             "config.json: %s %g, 0 as an f32: expected a number above 0 "
             "and at most %g",
             name, v->valuedouble, max);
  else {
    *out = (float)v->valuedouble;
    return 0;
  }
  return -1;
}

/* Field `name`: true or false; `dflt` when missing. */
static int bool_field(const cJSON *root, const char *name, int dflt, int *out,
                      char *err, size_t len) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
  if (v == NULL) {
    *out = dflt;
    return 0;
  }
  if (!cJSON_IsBool(v)) {
    snprintf(err, len, "config.json: %s is %s: expected true or false", name,
             json_kind(v));
    return -1;
  }
  *out = cJSON_IsTrue(v);
  return 0;
}

/* Field `name`, when present, must be one of the strings `a` or `b`. */
static int string_field(const cJSON *root, const char *name, const char *a,
                        const char *b, char *err, size_t len) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
  if (v == NULL || (cJSON_IsString(v) && (strcmp(v->valuestring, a) == 0 ||
                                          strcmp(v->valuestring, b) == 0)))
    return 0;
  snprintf(err, len, "config.json: %s %s%.64s%s: remat builds \"%s\" only",
           name, cJSON_IsString(v) ? "\"" : "is ",
           cJSON_IsString(v) ? v->valuestring : json_kind(v),
           cJSON_IsString(v) ? "\"" : "", a);
  return -1;
}

/* Field `name`, when present, must be null or false: a feature (rope
 * scaling, biases) that remat's model does not have. */
static int absent_field(const cJSON *root, const char *name, const char *why,
                        char *err, size_t len) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
  if (v == NULL || cJSON_IsNull(v) || cJSON_IsFalse(v))
    return 0;
  snprintf(err, len, "config.json: %s is set: %s", name, why);
  return -1;
}

enum {
  MAX_WIDTH = 65536,
  MAX_FFN = 1 << 20,
  MAX_HEADS = 4096,
  MAX_VOCAB = 1 << 24,
  MAX_POSITIONS = 1 << 24
};

static int divides(int width, int heads, const char *wname, const char *hname,
                   char *err, size_t len) {
  if (width % heads == 0)
    return 0;
  snprintf(err, len, "config.json: %s %d is not divisible by %s %d", wname,
           width, hname, heads);
  return -1;
}

/* rope_scaling: absent or null (none), or Llama 3's form: {"rope_type" (or
 * "type"): "llama3", "factor", "low_freq_factor", "high_freq_factor",
 * "original_max_position_embeddings"}. A message about one of its fields
 * names it as rope_scaling.FIELD. */
static int rope_scaling_field(const cJSON *r, remat_rope_scaling *out,
                              char *err, size_t len) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, "rope_scaling");
  if (v == NULL || cJSON_IsNull(v))
    return 0;
  if (!cJSON_IsObject(v)) {
    snprintf(err, len,
             "config.json: rope_scaling is %s: expected null or an object "
             "with rope_type \"llama3\"",
             json_kind(v));
    return -1;
  }
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(v, "rope_type");
  if (type == NULL)
    type = cJSON_GetObjectItemCaseSensitive(v, "type");
  if (!cJSON_IsString(type) || strcmp(type->valuestring, "llama3") != 0) {
    snprintf(err, len,
             "config.json: rope_scaling.rope_type %s%.64s%s: remat builds "
             "\"llama3\" only",
             cJSON_IsString(type) ? "\"" : "is ",
             cJSON_IsString(type) ? type->valuestring
             : type == NULL       ? "missing"
                                  : json_kind(type),
             cJSON_IsString(type) ? "\"" : "");
    return -1;
  }
  static const char *const need[] = {"factor", "low_freq_factor",
                                     "high_freq_factor"};
  float *at[] = {&out->factor, &out->low_freq_factor, &out->high_freq_factor};
  int rc = 0;
  for (int i = 0; i < 3 && rc == 0; i++) {
    if (cJSON_GetObjectItemCaseSensitive(v, need[i]) == NULL) {
      snprintf(err, len, "config.json: %s is missing", need[i]);
      rc = -1;
    } else {
      rc = float_field(v, need[i], 1e6, 0.0f, at[i], err, len);
    }
  }
  if (rc == 0)
    rc = int_field(v, "original_max_position_embeddings", 1, MAX_POSITIONS,
                   -1, &out->original_max_position_embeddings, err, len);
  if (rc != 0) { /* "config.json: X ..." -> "config.json: rope_scaling.X" */
    const char *head = "config.json: ";
    char rest[512];
    snprintf(rest, sizeof rest, "%s", err + strlen(head));
    snprintf(err, len, "%srope_scaling.%s", head, rest);
  }
  return rc;
}

static int read_llama(const cJSON *r, hf_model *m, char *err, size_t len) {
  remat_llama_config *c = &m->llama;
  int tied = 0;
  if (int_field(r, "hidden_size", 1, MAX_WIDTH, -1, &c->hidden_size, err,
                len) ||
      int_field(r, "intermediate_size", 1, MAX_FFN, -1, &c->intermediate_size,
                err, len) ||
      int_field(r, "num_hidden_layers", 1, REMAT_GPT_MAX_LAYERS, -1,
                &c->num_hidden_layers, err, len) ||
      int_field(r, "num_attention_heads", 1, MAX_HEADS, -1,
                &c->num_attention_heads, err, len) ||
      int_field(r, "num_key_value_heads", 1, MAX_HEADS, c->num_attention_heads,
                &c->num_key_value_heads, err, len) ||
      int_field(r, "vocab_size", 2, MAX_VOCAB, -1, &c->vocab_size, err, len) ||
      int_field(r, "max_position_embeddings", 1, MAX_POSITIONS, 0,
                &m->positions, err, len) ||
      float_field(r, "rms_norm_eps", 1.0, 1e-6f, &c->rms_norm_eps, err, len) ||
      float_field(r, "rope_theta", 1e12, 10000.0f, &c->rope_theta, err, len) ||
      bool_field(r, "tie_word_embeddings", 0, &tied, err, len) ||
      string_field(r, "hidden_act", "silu", "silu", err, len) ||
      rope_scaling_field(r, &c->rope_scaling, err, len) ||
      absent_field(r, "attention_bias",
                   "remat's Llama projections have no "
                   "bias",
                   err, len) ||
      absent_field(r, "mlp_bias", "remat's Llama feed-forward has no bias", err,
                   len) ||
      divides(c->hidden_size, c->num_attention_heads, "hidden_size",
              "num_attention_heads", err, len) ||
      divides(c->num_attention_heads, c->num_key_value_heads,
              "num_attention_heads", "num_key_value_heads", err, len))
    return -1;
  c->tie_word_embeddings = tied;
  m->vocab = c->vocab_size;
  return 0;
}

static int read_gpt2(const cJSON *r, hf_model *m, char *err, size_t len) {
  remat_gpt_config *c = &m->gpt;
  int tied = 1, inner = 0;
  if (int_field(r, "n_embd", 1, MAX_WIDTH, -1, &c->d_model, err, len) ||
      int_field(r, "n_layer", 1, REMAT_GPT_MAX_LAYERS, -1, &c->layers, err,
                len) ||
      int_field(r, "n_head", 1, MAX_HEADS, -1, &c->heads, err, len) ||
      int_field(r, "vocab_size", 2, MAX_VOCAB, -1, &c->vocab, err, len) ||
      int_field(r, "n_positions", 1, MAX_POSITIONS, -1, &c->positions, err,
                len) ||
      float_field(r, "layer_norm_epsilon", 1.0, 1e-5f, &c->ln_eps, err, len) ||
      bool_field(r, "tie_word_embeddings", 1, &tied, err, len) ||
      string_field(r, "activation_function", "gelu_new", "gelu_pytorch_tanh",
                   err, len) ||
      divides(c->d_model, c->heads, "n_embd", "n_head", err, len))
    return -1;
  const cJSON *n_inner = cJSON_GetObjectItemCaseSensitive(r, "n_inner");
  if (n_inner != NULL && !cJSON_IsNull(n_inner) &&
      (int_field(r, "n_inner", 1, MAX_FFN, -1, &inner, err, len) ||
       inner != 4 * c->d_model)) {
    if (inner != 0)
      snprintf(err, len,
               "config.json: n_inner %d: remat's GPT-2 "
               "feed-forward is 4 x n_embd = %d wide (or give null)",
               inner, 4 * c->d_model);
    return -1;
  }
  if (!tied) {
    snprintf(err, len,
             "config.json: tie_word_embeddings is false: remat's "
             "GPT-2 ties the LM head to wte");
    return -1;
  }
  c->tie_head = 1;
  m->vocab = c->vocab;
  m->positions = c->positions;
  return 0;
}

/* DIR/NAME when it is a regular file. */
static int find_file(const char *dir, const char *name, char *out, size_t len) {
  struct stat st;
  snprintf(out, len, "%s/%s", dir, name);
  return stat(out, &st) == 0 && S_ISREG(st.st_mode);
}

/* The text of DIR/config.json (a regular file of at most HF_CONFIG_MAX
 * bytes), parsed; NULL after a message. */
static cJSON *read_config(const char *dir, char *err, size_t len) {
  char path[4160];
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    snprintf(err, len, "--init '%.200s': cannot open config.json: %s", dir,
             strerror(errno));
    return NULL;
  }
  char *text = malloc(HF_CONFIG_MAX + 1);
  size_t n = text != NULL ? fread(text, 1, HF_CONFIG_MAX + 1, f) : 0;
  fclose(f);
  cJSON *root = NULL;
  if (text == NULL)
    snprintf(err, len, "out of memory");
  else if (n > HF_CONFIG_MAX)
    snprintf(err, len, "config.json: more than %d bytes", HF_CONFIG_MAX);
  else if ((root = cJSON_ParseWithLength(text, n)) == NULL ||
           !cJSON_IsObject(root))
    snprintf(err, len, "config.json: not a JSON object");
  free(text);
  if (root != NULL && !cJSON_IsObject(root)) {
    cJSON_Delete(root);
    root = NULL;
  }
  return root;
}

int hf_read(const char *dir, hf_model *m, char *err, size_t len) {
  memset(m, 0, sizeof *m);
  cJSON *root = read_config(dir, err, len);
  if (root == NULL)
    return -1;
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "model_type");
  int rc = -1;
  if (type == NULL)
    snprintf(err, len,
             "config.json: model_type is missing: expected "
             "\"llama\" or \"gpt2\"");
  else if (!cJSON_IsString(type))
    snprintf(err, len,
             "config.json: model_type is %s: expected \"llama\" or "
             "\"gpt2\"",
             json_kind(type));
  else if (strcmp(type->valuestring, "llama") == 0)
    rc = read_llama(root, m, err, len);
  else if (strcmp(type->valuestring, "gpt2") == 0) {
    m->gpt2 = 1;
    rc = read_gpt2(root, m, err, len);
  } else
    snprintf(err, len,
             "config.json: model_type \"%.64s\": expected \"llama\" "
             "or \"gpt2\"",
             type->valuestring);
  cJSON_Delete(root);
  if (rc == 0 &&
      !find_file(dir, "model.safetensors", m->weights, sizeof m->weights) &&
      !find_file(dir, "model.safetensors.index.json", m->weights,
                 sizeof m->weights)) {
    snprintf(err, len,
             "--init '%.200s': neither model.safetensors nor "
             "model.safetensors.index.json is there",
             dir);
    rc = -1;
  }
  return rc;
}

remat_status hf_build(remat_graph *g, const hf_model *m, int seq, int batch,
                      remat_attention_kind attention,
                      const remat_lora_config *lora, remat_gpt *out) {
  if (m->gpt2) {
    remat_gpt_config c = m->gpt;
    c.seq = seq;
    c.batch = batch;
    c.attention = attention;
    c.lora = *lora;
    return remat_gpt_build(g, &c, out);
  }
  remat_llama_config c = m->llama;
  c.seq = seq;
  c.batch = batch;
  c.attention = attention;
  c.lora = *lora;
  return remat_llama_build(g, &c, out);
}

remat_status hf_load(remat_graph *g, const hf_model *m) {
  return m->gpt2 ? remat_gpt_load_hf(g, m->weights)
                 : remat_load_safetensors(g, m->weights);
}
