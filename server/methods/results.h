/* server/methods/results.h: the JSON Schema of each method's result, keyed by method name
 * (results.c), beside the parameter tables of methods.c.
 *
 * The schemas name every field a result always carries (required) with its JSON type;
 * a result may carry further fields (additionalProperties is left open, so adding a
 * field is not a breaking change). Shared shapes are components ("Memory", ...) referred
 * to as #/components/schemas/NAME. tests/integration/test_result_schemas.py validates the
 * real answers of a live engramd against them.
 */
#ifndef ENGRAM_SERVER_RESULTS_H
#define ENGRAM_SERVER_RESULTS_H

#include <stddef.h>

#include "ubuf.h"

typedef struct {
    const char *name;   /* a method name, or a component name */
    const char *schema; /* a JSON Schema as JSON text */
} result_schema;

/* results_find returns the schema of method `name`, or NULL when none is declared. */
const char *results_find(const char *name);

/* results_expand appends to out the schema text with every reference to a component
 * ({"$ref":"#/components/schemas/NAME"}) replaced by that component's schema, a "title"
 * NAME added first (so a reader without the document's components, such as the `methods`
 * answer's clients/gen.py, still sees one named shape), references inside components
 * expanded in turn (at most 4 deep). Returns 0, -ENOMEM, or -EINVAL for a reference to an
 * unknown component or one nested too deep (out then holds part of the text; the caller
 * owns out in either case). */
int results_expand(const char *schema, ubuf *out);

/* The shared component schemas. */
extern const result_schema results_components[];
extern const size_t results_components_count;

#endif
