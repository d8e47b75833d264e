/* llm/llm_schema.h: the JSON Schema subset that model answers are checked against.
 *
 * Structured outputs are only as good as the check made on them: a provider may ignore
 * the schema (a local server without constrained decoding, a model that breaks the tool's
 * input_schema), so every structured answer is validated here before a call reports ok.
 *
 * The subset: type (object, array, string, number, integer, boolean, null, or an array of
 * them), properties, required, additionalProperties (false, true or a schema), enum,
 * const, items (one schema), minItems, maxItems, uniqueItems, minimum, maximum,
 * exclusiveMinimum, exclusiveMaximum (numbers), minLength, maxLength (in code points),
 * anyOf; boolean schemas (true, false). Annotations (title, description, default,
 * examples, $schema, $id, $comment, deprecated, readOnly, writeOnly) are accepted and
 * ignored. Any other keyword ($ref, pattern, format, oneOf...) makes llm_schema_create
 * fail: a schema is never half checked. An object with a key twice never validates.
 * Validation has a budget of about four million comparison steps (milliseconds): a value
 * that needs more (a flat object of thousands of keys, uniqueItems over thousands of items)
 * is invalid, "too large to check", rather than holding an event loop.
 *
 * Messages name the place with a path ("$.facts[2].id") and the rule broken; they quote
 * no value, so they can go into run records.
 */
#ifndef ENGRAM_LLM_SCHEMA_H
#define ENGRAM_LLM_SCHEMA_H

#include <stddef.h>

#include <msgpack.h>

typedef struct llm_schema llm_schema;

/* Positive results (0 success, -ENOMEM out of memory). */
enum {
    LLM_SCHEMA_E_SYNTAX = 1,  /* the schema or the value is not JSON (or nests too deep) */
    LLM_SCHEMA_E_UNSUPPORTED, /* a keyword outside the subset, or a keyword's value of the
                                 wrong kind */
    LLM_SCHEMA_E_INVALID,     /* the value breaks the schema */
};

/* llm_schema_create parses the schema's JSON text (len bytes) and checks it uses the
 * subset only. Returns 0 with *out, or -ENOMEM, LLM_SCHEMA_E_SYNTAX or
 * LLM_SCHEMA_E_UNSUPPORTED with err. Any thread; a schema is immutable once made and may
 * be shared by threads. */
int llm_schema_create(const char *json, size_t len, llm_schema **out, char *err, size_t errlen);

/* llm_schema_destroy frees s (NULL: no-op). */
void llm_schema_destroy(llm_schema *s);

/* llm_schema_validate checks value against s. Returns 0, or LLM_SCHEMA_E_INVALID with the
 * path and rule in err. Recursion follows the schema, so its depth is the schema's. */
int llm_schema_validate(const llm_schema *s, const msgpack_object *value, char *err, size_t errlen);

/* llm_schema_json returns the schema as compact JSON text (NUL-terminated, owned by s),
 * its length in *len when len is not NULL. */
const char *llm_schema_json(const llm_schema *s, size_t *len);

/* llm_schema_root_is_object tells whether the schema's root says "type": "object" (both
 * providers require that of a structured answer). */
int llm_schema_root_is_object(const llm_schema *s);

/* llm_schema_validate_json checks the JSON text value against the JSON text schema in one go.
 * Returns 0, -ENOMEM, or LLM_SCHEMA_E_SYNTAX (either text), LLM_SCHEMA_E_UNSUPPORTED
 * (the schema) or LLM_SCHEMA_E_INVALID (the value), with err. */
int llm_schema_validate_json(const char *schema_json, size_t schema_len, const char *value_json,
                             size_t value_len, char *err, size_t errlen);

#endif
