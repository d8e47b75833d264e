/* server/core/auth.h: API keys: generation, keyed hashing, the server secret and the admin key.
 *
 * A tenant key looks like `egk_<key id>_<secret>`: the key id (60 random bits, base32) is
 * stored in clear for lookup; the whole key is stored only as HMAC-SHA-256 under the
 * server secret and compared in constant time. The secret part carries 200 random bits.
 * Keys are shown once, at creation, and never logged.
 */
#ifndef ENGRAM_SERVER_AUTH_H
#define ENGRAM_SERVER_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server.h"

#define AUTH_KEY_ID_LEN 12
#define AUTH_SECRET_LEN 40
/* "egk_" + id + "_" + secret */
#define AUTH_KEY_LEN (4 + AUTH_KEY_ID_LEN + 1 + AUTH_SECRET_LEN)

/* auth_init initializes libsodium. Returns 0 or -EIO. */
int auth_init(void);

/* auth_load_secret reads the server secret from path, creating it (mode 600, 32 random
 * bytes as hex) when missing, into s->secret. Returns 0, or with err -EIO (the file cannot be
 * read or written) or -EINVAL (it holds no valid secret). */
int auth_load_secret(server *s, const char *path, char *err, size_t errlen);

/* auth_load_admin reads the admin key from path, creating a new one (mode 600) when the
 * file is missing, and keeps only its keyed hash in s. Returns 0, or with err -EIO (the file
 * cannot be read or written) or -EINVAL (the key in it is too short). */
int auth_load_admin(server *s, const char *path, char *err, size_t errlen);

/* auth_new_key writes a new tenant key (AUTH_KEY_LEN chars + NUL) into key and its key id
 * (AUTH_KEY_ID_LEN + NUL) into key_id. */
void auth_new_key(char key[AUTH_KEY_LEN + 1], char key_id[AUTH_KEY_ID_LEN + 1]);

/* auth_key_id extracts the key id of a tenant key of n bytes into key_id; false when the
 * key does not have the tenant-key shape. */
bool auth_key_id(const char *key, size_t n, char key_id[AUTH_KEY_ID_LEN + 1]);

/* auth_hash computes the keyed hash of key (n bytes) under s's secret. */
void auth_hash(const server *s, const char *key, size_t n, uint8_t out[32]);

/* auth_hash_hex writes the hash as 64 hex chars + NUL. */
void auth_hash_hex(const uint8_t hash[32], char out[65]);

/* auth_equal compares two hashes in constant time. */
bool auth_equal(const uint8_t a[32], const uint8_t b[32]);

/* auth_is_admin tells whether key (n bytes) is the admin key (constant time). */
bool auth_is_admin(const server *s, const char *key, size_t n);

#endif
