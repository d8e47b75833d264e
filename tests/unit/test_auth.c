/* tests/unit/test_auth.c: server/core/auth.c: tenant keys (their shape, the key id read
 * back, every malformed form refused), the keyed hash (fixed for one secret, different
 * under another, compared in constant time), the server secret file (created once with mode
 * 600, read back, refused when it is no 64-character hex secret or cannot be read) and the
 * admin key file (created, recognized, refused when short).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth.h"
#include "check.h"

static char dir[] = "/tmp/engram-test-auth-XXXXXX";

static void path_of(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", dir, name);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void test_keys(void)
{
    char key[AUTH_KEY_LEN + 1], id[AUTH_KEY_ID_LEN + 1], got[AUTH_KEY_ID_LEN + 1];
    auth_new_key(key, id);
    CHECK(strlen(key) == AUTH_KEY_LEN && strlen(id) == AUTH_KEY_ID_LEN);
    CHECK(strncmp(key, "egk_", 4) == 0 && key[4 + AUTH_KEY_ID_LEN] == '_');
    CHECK(memcmp(key + 4, id, AUTH_KEY_ID_LEN) == 0);
    for (size_t i = 4; i < AUTH_KEY_LEN; i++)
        if (i != 4 + AUTH_KEY_ID_LEN)
            CHECK((key[i] >= 'a' && key[i] <= 'z') || (key[i] >= '2' && key[i] <= '7'));
    CHECK(auth_key_id(key, strlen(key), got) && strcmp(got, id) == 0);
    /* two keys are never the same (200 random bits) */
    char key2[AUTH_KEY_LEN + 1], id2[AUTH_KEY_ID_LEN + 1];
    auth_new_key(key2, id2);
    CHECK(strcmp(key, key2) != 0 && strcmp(id, id2) != 0);

    /* malformed keys: each position and the length */
    char bad[AUTH_KEY_LEN + 2];
    strcpy(got, "unchanged!!!");
    CHECK(!auth_key_id(key, AUTH_KEY_LEN - 1, got));
    memcpy(bad, key, AUTH_KEY_LEN + 1);
    strcat(bad, "a");
    CHECK(!auth_key_id(bad, AUTH_KEY_LEN + 1, got));
    const struct {
        size_t at;
        char c;
    } flips[] = {
        {0, 'x'},                       /* prefix */
        {3, '-'},                       /* prefix separator */
        {4 + AUTH_KEY_ID_LEN, 'a'},     /* id/secret separator */
        {5, 'A'},                       /* upper case */
        {6, '0'},                       /* not base32 */
        {7, '1'},                       /* not base32 */
        {4 + AUTH_KEY_ID_LEN + 3, '8'}, /* in the secret */
        {AUTH_KEY_LEN - 1, '_'},        /* a second separator */
        {10, '\0'},                     /* a NUL inside */
        {AUTH_KEY_LEN - 2, (char)0xC3}, /* a non-ASCII byte */
    };
    for (size_t k = 0; k < sizeof(flips) / sizeof(flips[0]); k++) {
        memcpy(bad, key, AUTH_KEY_LEN + 1);
        bad[flips[k].at] = flips[k].c;
        CHECK_MSG(!auth_key_id(bad, AUTH_KEY_LEN, got), "a key with '%c' at %zu was accepted",
                  flips[k].c, flips[k].at);
    }
    CHECK(strcmp(got, "unchanged!!!") == 0); /* nothing written for a refused key */
}

static void test_hash(void)
{
    server s, other;
    memset(&s, 0, sizeof(s));
    memset(&other, 0, sizeof(other));
    for (int i = 0; i < 32; i++) {
        s.secret[i] = (uint8_t)i;
        other.secret[i] = (uint8_t)(i + 1);
    }
    uint8_t a[32], b[32], c[32], d[32];
    auth_hash(&s, "egk_key", 7, a);
    auth_hash(&s, "egk_key", 7, b);
    auth_hash(&other, "egk_key", 7, c);
    auth_hash(&s, "egk_kez", 7, d);
    CHECK(auth_equal(a, b) && !auth_equal(a, c) && !auth_equal(a, d));
    /* HMAC-SHA-256: the known value of this key under this secret */
    char hex[65];
    auth_hash_hex(a, hex);
    CHECK(strcmp(hex, "34e1cffeaf6f110c13016c3876c642f951a1c60cc49f27b332568ac7601ca5df") == 0);
    uint8_t e[32];
    auth_hash(&s, "", 0, e);
    CHECK(!auth_equal(a, e));
    /* only the first n bytes count */
    auth_hash(&s, "egk_keyEXTRA", 7, e);
    CHECK(auth_equal(a, e));
}

static void test_secret(void)
{
    char path[512], err[256];
    path_of(path, sizeof(path), "secret");
    server s;
    memset(&s, 0, sizeof(s));
    /* created at first start: 64 hex characters, mode 600 */
    CHECK(auth_load_secret(&s, path, err, sizeof(err)) == 0);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
    FILE *f = fopen(path, "r");
    char line[128] = "";
    if (f) {
        CHECK(fgets(line, sizeof(line), f) != NULL);
        fclose(f);
    }
    CHECK(strlen(line) == 65 && line[64] == '\n' && strspn(line, "0123456789abcdef") == 64);
    uint8_t zero[32] = {0};
    CHECK(memcmp(s.secret, zero, 32) != 0);
    /* read back at the next start: the same secret */
    server s2;
    memset(&s2, 0, sizeof(s2));
    CHECK(auth_load_secret(&s2, path, err, sizeof(err)) == 0);
    CHECK(memcmp(s.secret, s2.secret, 32) == 0);
    /* a hand-written secret with surrounding space and CRLF */
    write_file(path, "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f \r\n");
    CHECK(auth_load_secret(&s2, path, err, sizeof(err)) == 0);
    CHECK(s2.secret[0] == 0 && s2.secret[15] == 15 && s2.secret[31] == 31);
    /* not a secret: refused with the file named */
    const char *bad[] = {"", "abc",
                         "zz0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
                         "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f00"};
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        write_file(path, bad[k]);
        err[0] = '\0';
        CHECK_MSG(auth_load_secret(&s2, path, err, sizeof(err)) == -EINVAL, "'%s' accepted",
                  bad[k]);
        CHECK_STR_CONTAINS(err, path);
    }
    unlink(path);
    /* a directory that does not exist: the file cannot be created */
    CHECK(auth_load_secret(&s2, "/nonexistent/engram/secret", err, sizeof(err)) == -EIO);
    CHECK_STR_CONTAINS(err, "/nonexistent/engram/secret");
    /* a path that is a directory: cannot be read */
    err[0] = '\0';
    CHECK(auth_load_secret(&s2, dir, err, sizeof(err)) < 0);
}

static void test_admin(void)
{
    char path[512], err[256];
    path_of(path, sizeof(path), "admin");
    server s;
    memset(&s, 0, sizeof(s));
    s.secret[0] = 42;
    CHECK(!auth_is_admin(&s, "anything", 8)); /* no admin key loaded */
    /* created: "ega_" and 40 base32 characters, mode 600 */
    CHECK(auth_load_admin(&s, path, err, sizeof(err)) == 0 && s.have_admin);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
    char key[128] = "";
    FILE *f = fopen(path, "r");
    if (f) {
        CHECK(fgets(key, sizeof(key), f) != NULL);
        fclose(f);
    }
    key[strcspn(key, "\n")] = '\0';
    CHECK(strlen(key) == 4 + AUTH_SECRET_LEN && strncmp(key, "ega_", 4) == 0);
    CHECK(auth_is_admin(&s, key, strlen(key)));
    CHECK(!auth_is_admin(&s, key, strlen(key) - 1));
    key[10] = key[10] == 'a' ? 'b' : 'a';
    CHECK(!auth_is_admin(&s, key, strlen(key)));
    /* an operator's own key; the file is kept as written */
    write_file(path, "my-own-admin-key-0123\n");
    server s2;
    memset(&s2, 0, sizeof(s2));
    s2.secret[0] = 42;
    CHECK(auth_load_admin(&s2, path, err, sizeof(err)) == 0);
    CHECK(auth_is_admin(&s2, "my-own-admin-key-0123", 21));
    /* the hash is keyed: the same key under another secret is another hash */
    s2.secret[0] = 43;
    CHECK(!auth_is_admin(&s2, "my-own-admin-key-0123", 21));
    /* too short to be a key */
    write_file(path, "short\n");
    CHECK(auth_load_admin(&s2, path, err, sizeof(err)) == -EINVAL);
    CHECK_STR_CONTAINS(err, "shorter than 16");
    unlink(path);
    CHECK(auth_load_admin(&s2, "/nonexistent/engram/admin", err, sizeof(err)) == -EIO);
}

int main(void)
{
    if (auth_init() != 0 || !mkdtemp(dir)) {
        fprintf(stderr, "cannot set up\n");
        return 1;
    }
    test_keys();
    test_hash();
    test_secret();
    test_admin();
    rmdir(dir);
    CHECK_RETURN();
}
