/* server/core/auth.c: API keys, the server secret and the admin key (see auth.h). */
#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

static const char b32[] = "abcdefghijklmnopqrstuvwxyz234567";

int auth_init(void)
{
    return sodium_init() < 0 ? -EIO : 0;
}

/* Fills out with n random base32 characters (5 random bits each). */
static void random_b32(char *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = b32[randombytes_uniform(32)];
}

void auth_new_key(char key[AUTH_KEY_LEN + 1], char key_id[AUTH_KEY_ID_LEN + 1])
{
    memcpy(key, "egk_", 4);
    random_b32(key + 4, AUTH_KEY_ID_LEN);
    key[4 + AUTH_KEY_ID_LEN] = '_';
    random_b32(key + 5 + AUTH_KEY_ID_LEN, AUTH_SECRET_LEN);
    key[AUTH_KEY_LEN] = '\0';
    memcpy(key_id, key + 4, AUTH_KEY_ID_LEN);
    key_id[AUTH_KEY_ID_LEN] = '\0';
}

bool auth_key_id(const char *key, size_t n, char key_id[AUTH_KEY_ID_LEN + 1])
{
    if (n != AUTH_KEY_LEN || memcmp(key, "egk_", 4) != 0 || key[4 + AUTH_KEY_ID_LEN] != '_')
        return false;
    for (size_t i = 4; i < n; i++) {
        if (i == 4 + AUTH_KEY_ID_LEN)
            continue;
        if (!strchr(b32, key[i]) || key[i] == '\0')
            return false;
    }
    memcpy(key_id, key + 4, AUTH_KEY_ID_LEN);
    key_id[AUTH_KEY_ID_LEN] = '\0';
    return true;
}

void auth_hash(const server *s, const char *key, size_t n, uint8_t out[32])
{
    crypto_auth_hmacsha256(out, (const unsigned char *)key, n, s->secret);
}

void auth_hash_hex(const uint8_t hash[32], char out[65])
{
    sodium_bin2hex(out, 65, hash, 32);
}

bool auth_equal(const uint8_t a[32], const uint8_t b[32])
{
    return sodium_memcmp(a, b, 32) == 0;
}

bool auth_is_admin(const server *s, const char *key, size_t n)
{
    if (!s->have_admin)
        return false;
    uint8_t h[32];
    auth_hash(s, key, n, h);
    return auth_equal(h, s->admin_hash);
}

/* Reads a small file's first line, trimmed, into buf. Returns 0, -ENOENT, or -1. */
static int read_line(const char *path, char *buf, size_t n, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT)
            return -ENOENT;
        snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
        return -EIO;
    }
    if (!fgets(buf, (int)n, f))
        buf[0] = '\0';
    fclose(f);
    size_t len = strlen(buf);
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' '))
        buf[--len] = '\0';
    return 0;
}

/* Creates path with mode 600 holding line; fails if it exists (another process won). */
static int write_new(const char *path, const char *line, char *err, size_t errlen)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        if (errno == EEXIST)
            return -EEXIST;
        snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
        return -EIO;
    }
    size_t n = strlen(line);
    bool ok = write(fd, line, n) == (ssize_t)n && write(fd, "\n", 1) == 1 && fsync(fd) == 0;
    close(fd);
    if (!ok) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        unlink(path);
        return -EIO;
    }
    return 0;
}

int auth_load_secret(server *s, const char *path, char *err, size_t errlen)
{
    char line[256];
    for (int attempt = 0; attempt < 2; attempt++) {
        int rc = read_line(path, line, sizeof(line), err, errlen);
        if (rc == 0) {
            size_t got = 0;
            if (sodium_hex2bin(s->secret, sizeof(s->secret), line, strlen(line), NULL, &got,
                               NULL) != 0 ||
                got != sizeof(s->secret)) {
                snprintf(err, errlen, "%s does not hold a 64-character hex secret", path);
                return -EINVAL;
            }
            return 0;
        }
        if (rc != -ENOENT)
            return -EIO;
        uint8_t secret[32];
        char hex[65];
        randombytes_buf(secret, sizeof(secret));
        sodium_bin2hex(hex, sizeof(hex), secret, sizeof(secret));
        rc = write_new(path, hex, err, errlen);
        sodium_memzero(hex, sizeof(hex));
        if (rc == 0) {
            memcpy(s->secret, secret, sizeof(secret));
            return 0;
        }
        if (rc != -EEXIST)
            return -EIO;
    }
    snprintf(err, errlen, "cannot read or create %s", path);
    return -EIO;
}

int auth_load_admin(server *s, const char *path, char *err, size_t errlen)
{
    char line[512];
    int rc = read_line(path, line, sizeof(line), err, errlen);
    if (rc == -ENOENT) {
        memcpy(line, "ega_", 4);
        random_b32(line + 4, AUTH_SECRET_LEN);
        line[4 + AUTH_SECRET_LEN] = '\0';
        rc = write_new(path, line, err, errlen);
        if (rc == -EEXIST)
            rc = read_line(path, line, sizeof(line), err, errlen);
    }
    if (rc != 0)
        return -EIO;
    if (strlen(line) < 16) {
        snprintf(err, errlen, "the admin key in %s is shorter than 16 characters", path);
        return -EINVAL;
    }
    auth_hash(s, line, strlen(line), s->admin_hash);
    s->have_admin = true;
    sodium_memzero(line, sizeof(line));
    return 0;
}
