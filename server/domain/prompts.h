/* server/domain/prompts.h: the prompt templates, embedded at build time.
 *
 * Prompts are code: they live as files in server/prompts/ (reviewed, diffed, versioned with
 * the server), and server/prompts/gen_prompts.py compiles them into the binary, as the
 * migrations and the console are. A template's placeholders are {{name}}; prompts_render
 * fills them. What fills them is the caller's to escape (consolidate_model.c puts memories
 * into JSON lines between delimiters that no memory text can close).
 */
#ifndef ENGRAM_SERVER_PROMPTS_H
#define ENGRAM_SERVER_PROMPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ubuf.h"

typedef struct prompt_file {
    const char *name; /* the file's base name, e.g. "consolidate_system.txt" */
    const char *text; /* NUL-terminated UTF-8 */
    size_t len;
} prompt_file;

extern const prompt_file prompt_files[];
extern const int prompt_nfiles;

/* prompts_get returns the text of the template named name (its length in *len when len is
 * not NULL), or NULL when there is none. Any thread. */
const char *prompts_get(const char *name, size_t *len);

/* prompts_render appends to out the template named name with each {{key}} replaced by the
 * value of the same index in keys/vals (n of them, values taken as they are). A placeholder
 * with no value is an error. Returns 0, -ENOENT (no such template or an unknown
 * placeholder) or -ENOMEM. Any thread. */
int prompts_render(const char *name, const char *const *keys, const char *const *vals, size_t n,
                   ubuf *out);

/* prompts_json_str appends s (n bytes of UTF-8) to b as a JSON string, escaping '"', '\\',
 * control characters and also '<', '>' and '&', so that no text put into a prompt can write
 * one of its delimiting tags (</memories>, </transcript>): what a memory or a message says
 * stays data. prompts_json_cstr does it for a NUL-terminated s. Return 0 or -ENOMEM. */
int prompts_json_str(ubuf *b, const char *s, size_t n);
int prompts_json_cstr(ubuf *b, const char *s);

/* prompts_utf8_cut returns the length of s (len bytes) cut to at most max bytes, never
 * inside a UTF-8 sequence. */
size_t prompts_utf8_cut(const char *s, size_t len, size_t max);

/* prompts_utc writes the UTC time of ms since the epoch into out: "2024-06-10T14:03:00Z",
 * or the date only ("2024-06-10"). */
void prompts_utc(int64_t ms, bool date_only, char *out, size_t outlen);

#endif
