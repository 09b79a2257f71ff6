/* Structured output: the answer is a JSON document valid against a schema
 * (the `response_format` request option), ready for a JSON parser.
 *
 *   json_output MODEL_PATH ["request"]
 *
 * Every draw is masked to the tokens that keep the document valid, so the
 * stream ends with a complete document (finish reason STOP) or, if
 * max_tokens runs out first, with LENGTH. A schema that cannot be compiled
 * fails the submit with MLXRT_STATUS_INVALID_ARGUMENT and says why.
 *
 * Build:
 *   cc -std=c11 -Iinclude examples/json_output.c -Ltarget/release -lmlxrt \
 *      -Wl,-rpath,$PWD/target/release -o build/json_output
 */
#include <stdio.h>

#include "mlxrt.h"

/* OpenAI's shape; {"type": "json_schema", "schema": {...}},
 * {"type": "json_object"}, {"type": "regex", "pattern": "..."} and
 * {"type": "grammar", "lark": "..."} work too. */
static const char *OPTIONS =
    "{\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"city\", \"schema\": {"
    "\"type\": \"object\","
    "\"properties\": {"
    "  \"city\": {\"type\": \"string\", \"maxLength\": 40},"
    "  \"country\": {\"type\": \"string\", \"maxLength\": 40},"
    "  \"population_millions\": {\"type\": \"number\", \"minimum\": 0, \"maximum\": 100},"
    "  \"landmarks\": {\"type\": \"array\", \"items\": {\"type\": \"string\", \"maxLength\": 40}, \"maxItems\": 3}"
    "},"
    "\"required\": [\"city\", \"country\", \"population_millions\", \"landmarks\"],"
    "\"additionalProperties\": false}}}}";

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL_PATH [\"request\"]\n", argv[0]);
    return 2;
  }
  const char *request = argc > 2 ? argv[2] : "Describe Paris.";

  mlxrt_engine_config config;
  mlxrt_engine_config_init(&config);
  config.model_path = argv[1];
  mlxrt_engine *engine = NULL;
  mlxrt_error *error = NULL;
  if (mlxrt_engine_create(&config, &engine, &error) != MLXRT_STATUS_OK) {
    fprintf(stderr, "cannot load %s: %s\n", argv[1], mlxrt_error_message(error));
    mlxrt_error_free(error);
    return 1;
  }

  /* The request goes into the JSON as is: keep it free of quotes here
   * (examples/chat.c shows escaping). */
  char messages[1024];
  snprintf(messages, sizeof messages, "[{\"role\": \"user\", \"content\": \"%s Reply in JSON.\"}]", request);
  mlxrt_request_params params;
  mlxrt_request_params_init(&params);
  params.messages_json = messages;
  params.max_tokens = 128;
  params.options_json = OPTIONS;

  mlxrt_stream *stream = NULL;
  if (mlxrt_request_submit_stream(engine, &params, &stream, &error) != MLXRT_STATUS_OK) {
    fprintf(stderr, "submit failed: %s\n", mlxrt_error_message(error));
    mlxrt_error_free(error);
    mlxrt_engine_destroy(engine);
    return 1;
  }
  int failed = 0;
  for (;;) {
    const mlxrt_event *ev = NULL;
    mlxrt_status st = mlxrt_stream_next(stream, -1, &ev, NULL);
    if (st == MLXRT_STATUS_END_OF_STREAM) break;
    if (st != MLXRT_STATUS_OK) {
      fprintf(stderr, "stream error: %s\n", mlxrt_status_name(st));
      failed = 1;
      break;
    }
    if (ev->kind == MLXRT_EVENT_KIND_DELTA) {
      fwrite(ev->text, 1, ev->text_len, stdout);
    } else if (ev->kind == MLXRT_EVENT_KIND_DONE) {
      int complete = ev->finish_reason == MLXRT_FINISH_REASON_STOP;
      printf("\n[%s: %u tokens]\n", complete ? "complete document" : "cut off by max_tokens",
             ev->usage.completion_tokens);
      failed = !complete;
    } else {
      fprintf(stderr, "\nerror: %s\n", ev->error_message);
      failed = 1;
    }
  }
  mlxrt_stream_free(stream);

  /* A schema that cannot be compiled is refused at submit, with the reason. */
  params.options_json = "{\"response_format\": {\"type\": \"json_schema\", \"schema\": {\"type\": \"frobnicate\"}}}";
  mlxrt_status st = mlxrt_request_submit_stream(engine, &params, &stream, &error);
  printf("bad schema: %s: %s\n", mlxrt_status_name(st), mlxrt_error_message(error));
  mlxrt_error_free(error);
  if (st != MLXRT_STATUS_INVALID_ARGUMENT) failed = 1;

  mlxrt_engine_destroy(engine);
  return failed;
}
