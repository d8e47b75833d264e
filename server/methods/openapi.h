/* server/methods/openapi.h: the OpenAPI 3.1 description of the HTTP/JSON API, generated
 * from the method table (GET /v1/openapi.json).
 *
 * Every method but `auth` is a path POST /v1/rpc/{method} whose request body is an object of
 * the method's parameters, with the types, required names and ranges of the table's
 * schemas; every error answer is the Error object; tenant and admin methods need the bearer
 * security scheme; 429 and 503 declare Retry-After. A 200 answer has the method's result
 * schema from results.c, with its shared components.
 */
#ifndef ENGRAM_SERVER_OPENAPI_H
#define ENGRAM_SERVER_OPENAPI_H

#include "server.h"

struct evbuffer;

/* openapi_render appends the document to out. Returns 0, or -ENOMEM. Any thread. */
int openapi_render(const server *s, struct evbuffer *out);

#endif
