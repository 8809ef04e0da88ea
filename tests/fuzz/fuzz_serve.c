/* Fuzz target: remat-serve's request bodies (tools/serve_json.c). Byte 0
 * picks the parser (bits 0-1: generate, job, load; 3 is generate again)
 * and the model's tokens (bits 2-3: addition, bytes, u16); bytes 1-2 the
 * vocabulary (1 to 65536) and byte 3 --max-tokens (1 to 256); the rest is
 * the body. A refused body must leave a one-line message that names a
 * field or the body, which json_error writes as JSON that reads back the
 * same; an accepted one must hold only values in their ranges (token ids
 * below the vocabulary, at least one; max_tokens, temperature, top_k,
 * steps, lr, save_every within their bounds; exactly one of a load's path
 * and job). */
#include <cjson/cJSON.h>
#include <math.h>

#include "fuzz_util.h"
#include "tools/serve.h"

static void check_refusal(const char *err) {
  FUZZ_CHECK(err[0] != '\0' && strchr(err, '\n') == NULL);
  FUZZ_CHECK(strncmp(err, "the body ", 9) == 0 ||
             strncmp(err, "unknown field '", 15) == 0 ||
             strncmp(err, "field '", 7) == 0 || err[0] == '\'' ||
             strncmp(err, "give one of ", 12) == 0 ||
             strcmp(err, "out of memory") == 0);
  char *json = json_error(err);
  FUZZ_CHECK(json != NULL);
  cJSON *back = cJSON_Parse(json);
  FUZZ_CHECK(back != NULL);
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(back, "error");
  FUZZ_CHECK(cJSON_IsString(e) && strcmp(e->valuestring, err) == 0);
  cJSON_Delete(back);
  free(json);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_reader r = {data, size, 0};
  unsigned pick = fuzz_byte(&r);
  serve_limits lim = {.format = (serve_format)((pick >> 2) % 3)};
  lim.vocab = (int)((fuzz_byte(&r) << 8 | fuzz_byte(&r)) + 1);
  lim.max_tokens = (int)fuzz_byte(&r) + 1;
  const char *body = (const char *)data + r.pos;
  size_t len = size - r.pos;
  char *copy = fuzz_cstring((const uint8_t *)body, len); /* as served */
  FUZZ_CHECK(copy != NULL);
  char err[1024] = "";
  switch (pick & 3) {
  case 1: {
    job_params p;
    if (parse_job(copy, len, &p, err, sizeof err) != 0) {
      check_refusal(err);
      FUZZ_CHECK(p.data == NULL && p.policy == NULL && p.save == NULL);
      break;
    }
    FUZZ_CHECK(p.data != NULL && p.data[0] != '\0');
    FUZZ_CHECK(p.steps >= 1 && p.steps <= 1000000);
    FUZZ_CHECK(p.lr > 0.0f && p.lr <= 1.0f);
    FUZZ_CHECK(p.save_every >= 0 && p.save_every <= 1000000);
    FUZZ_CHECK(p.budget >= 0 || p.budget == REMAT_RUNTIME_BUDGET);
    job_params_free(&p);
    break;
  }
  case 2: {
    char *path, *job;
    if (parse_load(copy, len, &path, &job, err, sizeof err) != 0) {
      check_refusal(err);
      FUZZ_CHECK(path == NULL && job == NULL);
      break;
    }
    FUZZ_CHECK((path == NULL) != (job == NULL));
    free(path);
    free(job);
    break;
  }
  default: {
    gen_params p;
    if (parse_generate(copy, len, &lim, &p, err, sizeof err) != 0) {
      check_refusal(err);
      FUZZ_CHECK(p.prompt == NULL);
      break;
    }
    FUZZ_CHECK(p.n >= 1 && p.prompt != NULL);
    for (int i = 0; i < p.n; i++)
      FUZZ_CHECK(p.prompt[i] >= 0 && p.prompt[i] < lim.vocab);
    FUZZ_CHECK(p.max_tokens >= 1 && p.max_tokens <= lim.max_tokens);
    FUZZ_CHECK(p.temperature >= 0.0f && p.temperature <= 100.0f &&
               !isnan(p.temperature));
    FUZZ_CHECK(p.top_k >= 0 && p.top_k <= lim.vocab);
    gen_params_free(&p);
  }
  }
  free(copy);
  return 0;
}
