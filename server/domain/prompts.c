/* server/domain/prompts.c: the embedded prompt templates (see prompts.h). */
#include "prompts.h"

#include <errno.h>
#include <string.h>
#include <time.h>

const char *prompts_get(const char *name, size_t *len)
{
    for (int i = 0; i < prompt_nfiles; i++)
        if (strcmp(prompt_files[i].name, name) == 0) {
            if (len)
                *len = prompt_files[i].len;
            return prompt_files[i].text;
        }
    return NULL;
}

int prompts_render(const char *name, const char *const *keys, const char *const *vals, size_t n,
                   ubuf *out)
{
    size_t len;
    const char *t = prompts_get(name, &len), *end = t ? t + len : NULL;
    if (!t)
        return -ENOENT;
    while (t < end) {
        const char *open = strstr(t, "{{");
        if (!open) {
            if (ubuf_append(out, t, (size_t)(end - t)) < 0)
                return -ENOMEM;
            break;
        }
        const char *close = strstr(open + 2, "}}");
        if (!close)
            return -ENOENT;
        if (ubuf_append(out, t, (size_t)(open - t)) < 0)
            return -ENOMEM;
        size_t kl = (size_t)(close - open - 2);
        size_t k = 0;
        while (k < n && (strlen(keys[k]) != kl || memcmp(keys[k], open + 2, kl) != 0))
            k++;
        if (k == n)
            return -ENOENT;
        if (ubuf_append(out, vals[k], strlen(vals[k])) < 0)
            return -ENOMEM;
        t = close + 2;
    }
    return 0;
}

int prompts_json_str(ubuf *b, const char *s, size_t n)
{
    if (ubuf_putc(b, '"') < 0)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        int rc;
        if (c == '"' || c == '\\')
            rc = ubuf_putc(b, '\\') < 0 ? -ENOMEM : ubuf_putc(b, (char)c);
        else if (c < 0x20 || c == '<' || c == '>' || c == '&' || c == 0x7f)
            rc = ubuf_printf(b, "\\u%04x", c);
        else
            rc = ubuf_putc(b, (char)c);
        if (rc < 0)
            return -ENOMEM;
    }
    return ubuf_putc(b, '"');
}

int prompts_json_cstr(ubuf *b, const char *s)
{
    return prompts_json_str(b, s, strlen(s));
}

size_t prompts_utf8_cut(const char *s, size_t len, size_t max)
{
    if (len <= max)
        return len;
    while (max > 0 && ((unsigned char)s[max] & 0xC0) == 0x80)
        max--;
    return max;
}

void prompts_utc(int64_t ms, bool date_only, char *out, size_t outlen)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, outlen, date_only ? "%Y-%m-%d" : "%Y-%m-%dT%H:%M:%SZ", &tm);
}
