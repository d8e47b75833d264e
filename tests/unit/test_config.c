/* tests/unit/test_config.c: server/config: the settings table and its four sources.
 *
 * What config.h promises: defaults, then the config file, then ENGRAM_* variables, then
 * flags, each overriding the one before; every value checked against its type and range,
 * the first bad one stopping the load with a message naming the setting and its source;
 * unknown settings refused wherever they appear; the cross-field checks; --help; secrets
 * redacted when printed.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "config.h"
#include "index_engine.h"

extern char **environ;

/* Every ENGRAM_* variable of the test's own environment would leak into the loads. */
static void clear_engram_env(void)
{
    for (;;) {
        char name[256] = "";
        for (char **e = environ; e && *e; e++) {
            if (strncmp(*e, "ENGRAM_", 7) == 0) {
                size_t n = strcspn(*e, "=");
                if (n < sizeof(name)) {
                    memcpy(name, *e, n);
                    name[n] = '\0';
                }
                break;
            }
        }
        if (!name[0])
            return;
        unsetenv(name);
    }
}

typedef struct result {
    int rc;
    bool exit_now;
    char *out; /* what config_load printed to out and err (malloc'd) */
    char *err;
} result;

/* Loads cfg from argv "engramd" followed by the NULL-terminated args. */
static result load(config *cfg, const char *const *args)
{
    char *argv[64];
    int argc = 0;
    argv[argc++] = "engramd";
    for (size_t i = 0; args && args[i]; i++)
        argv[argc++] = (char *)args[i];
    argv[argc] = NULL;
    result r = {0};
    size_t no = 0, ne = 0;
    FILE *out = open_memstream(&r.out, &no), *err = open_memstream(&r.err, &ne);
    r.rc = config_load(cfg, argc, argv, out, err, &r.exit_now);
    fclose(out);
    fclose(err);
    return r;
}

static void result_free(result *r)
{
    free(r->out);
    free(r->err);
}

/* Loads with args and expects a failure whose message contains want. */
static void expect_error(const char *const *args, const char *want)
{
    config cfg;
    result r = load(&cfg, args);
    CHECK_MSG(r.rc == -EINVAL, "accepted; expected '%s'", want);
    CHECK_STR_CONTAINS(r.err, want);
    config_free(&cfg); /* strings set before the failure are freed too */
    result_free(&r);
}

static char *write_file(const char *text)
{
    char *path = strdup("/tmp/engram-test-config-XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text)) {
        perror("config file");
        abort();
    }
    close(fd);
    return path;
}

static void remove_file(char *path)
{
    unlink(path);
    free(path);
}

static void test_defaults(void)
{
    config cfg;
    result r = load(&cfg, (const char *[]){"--pg-dsn", "dbname=x", NULL});
    CHECK_MSG(r.rc == 0, "%s", r.err);
    /* the values README and the seed specify */
    CHECK(strcmp(cfg.listen_host, "127.0.0.1") == 0);
    CHECK(cfg.rpc_port == 7420 && cfg.http_port == 7421);
    CHECK(cfg.score_w_recency == 0.3 && cfg.score_w_access == 0.3 && cfg.score_w_explicit == 0.4);
    CHECK(cfg.score_recency_days == 30 && cfg.score_access_saturation == 10);
    CHECK(cfg.similarity_weight == 0.7);
    CHECK(strcmp(cfg.index_engine, "native") == 0 && strcmp(cfg.log_level, "info") == 0);
    CHECK(cfg.tier_max_memories[0] == 100 && cfg.tier_max_memories[1] == 5000 &&
          cfg.tier_max_memories[2] == 50000);
    CHECK(cfg.tier_queries_per_day[2] == 0); /* premium: unlimited */
    CHECK(cfg.max_output_bytes == 67108864L);
    CHECK(strcmp(cfg.pg_dsn, "dbname=x") == 0);
    CHECK(!r.exit_now);
    config_free(&cfg);
    CHECK(cfg.pg_dsn == NULL && cfg.listen_host == NULL); /* config_free clears */
    result_free(&r);
}

static void test_flag_forms(void)
{
    config cfg;
    /* --name value, --name=value, dashes or underscores */
    result r = load(&cfg, (const char *[]){"--pg-dsn=dbname=x", "--rpc-port", "8000",
                                           "--http_port=0", "--similarity-weight=0.25", NULL});
    CHECK_MSG(r.rc == 0, "%s", r.err);
    CHECK(strcmp(cfg.pg_dsn, "dbname=x") == 0); /* only the first '=' separates */
    CHECK(cfg.rpc_port == 8000 && cfg.http_port == 0 && cfg.similarity_weight == 0.25);
    config_free(&cfg);
    result_free(&r);
    /* the last occurrence wins (and the earlier string is not leaked) */
    r = load(&cfg, (const char *[]){"--pg-dsn", "a", "--pg-dsn", "b", "--listen-host", "::1",
                                    "--listen-host", "0.0.0.0", NULL});
    CHECK(r.rc == 0 && strcmp(cfg.pg_dsn, "b") == 0 && strcmp(cfg.listen_host, "0.0.0.0") == 0);
    config_free(&cfg);
    result_free(&r);
}

static void test_ranges_and_types(void)
{
#define DSN "--pg-dsn", "x"
    /* integers: whole text, inside the range, both ends included */
    config cfg;
    result r = load(&cfg, (const char *[]){DSN, "--rpc-port", "65535", "--http-port", "1", NULL});
    CHECK(r.rc == 0 && cfg.rpc_port == 65535 && cfg.http_port == 1);
    config_free(&cfg);
    result_free(&r);
    expect_error((const char *[]){DSN, "--rpc-port", "65536", NULL},
                 "invalid value for rpc_port (from --rpc-port): 65536 is out of range 1..65535");
    expect_error((const char *[]){DSN, "--rpc-port", "0", NULL}, "out of range 1..65535");
    expect_error((const char *[]){DSN, "--rpc-port", "80x", NULL},
                 "invalid value for rpc_port (from --rpc-port): '80x' is not an integer");
    expect_error((const char *[]){DSN, "--rpc-port", "", NULL}, "'' is not an integer");
    expect_error((const char *[]){DSN, "--rpc-port", "8.5", NULL}, "is not an integer");
    expect_error((const char *[]){DSN, "--workers", "99999999999999999999", NULL},
                 "is not an integer"); /* overflows long long */
    expect_error((const char *[]){DSN, "--workers", "-1", NULL}, "out of range 0..256");
    /* longs take values past int */
    r = load(&cfg, (const char *[]){DSN, "--max-output-bytes", "4294967296", NULL});
    CHECK(r.rc == 0 && cfg.max_output_bytes == 4294967296L);
    config_free(&cfg);
    result_free(&r);
    expect_error((const char *[]){DSN, "--max-output-bytes", "4294967297", NULL}, "out of range");
    /* doubles: finite, in range */
    r = load(&cfg, (const char *[]){DSN, "--similarity-weight", "1", "--index-recall-target", "0.5",
                                    NULL});
    CHECK(r.rc == 0 && cfg.similarity_weight == 1.0 && cfg.index_recall_target == 0.5);
    config_free(&cfg);
    result_free(&r);
    expect_error((const char *[]){DSN, "--similarity-weight", "1.01", NULL},
                 "invalid value for similarity_weight (from --similarity-weight): 1.01 is out of "
                 "range 0..1");
    expect_error((const char *[]){DSN, "--similarity-weight", "nan", NULL}, "is not a number");
    expect_error((const char *[]){DSN, "--similarity-weight", "inf", NULL}, "is not a number");
    expect_error((const char *[]){DSN, "--similarity-weight", "0.5abc", NULL},
                 "'0.5abc' is not a number");
    expect_error((const char *[]){DSN, "--index-recall-target", "0.49", NULL}, "out of range");
    /* strings take anything, including the empty string */
    r = load(&cfg, (const char *[]){DSN, "--admin-key-file", "", "--openai-model", "m x", NULL});
    CHECK(r.rc == 0 && cfg.admin_key_file[0] == '\0' && strcmp(cfg.openai_model, "m x") == 0);
    config_free(&cfg);
    result_free(&r);
#undef DSN
}

static void test_unknown_and_malformed(void)
{
    expect_error((const char *[]){"--pg-dsn", "x", "--rpc-prot", "1", NULL},
                 "unknown setting '--rpc-prot'");
    expect_error((const char *[]){"--pg-dsn", "x", "serve", NULL}, "unexpected argument 'serve'");
    expect_error((const char *[]){"--pg-dsn", "x", "-p", "1", NULL}, "unexpected argument '-p'");
    expect_error((const char *[]){"--pg-dsn", "x", "--rpc-port", NULL}, "--rpc-port needs a value");
    /* a setting name longer than any is unknown, not a buffer overrun */
    char longname[200] = "--";
    memset(longname + 2, 'a', 150);
    longname[152] = '\0';
    expect_error((const char *[]){"--pg-dsn", "x", longname, "1", NULL}, "unknown setting");
}

static void test_cross_field(void)
{
    expect_error(NULL, "pg_dsn is required");
    expect_error((const char *[]){"--pg-dsn", "", NULL}, "pg_dsn is required");
    expect_error((const char *[]){"--pg-dsn", "x", "--score-w-recency", "0.5", NULL},
                 "score_w_recency + score_w_access + score_w_explicit must be 1");
    /* weights that sum to 1 another way are fine */
    config cfg;
    result r = load(&cfg, (const char *[]){"--pg-dsn", "x", "--score-w-recency", "0.5",
                                           "--score-w-access", "0.1", NULL});
    CHECK_MSG(r.rc == 0, "%s", r.err);
    config_free(&cfg);
    result_free(&r);
    expect_error((const char *[]){"--pg-dsn", "x", "--http-port", "7420", NULL},
                 "http_port and rpc_port must differ");
    expect_error((const char *[]){"--pg-dsn", "x", "--max-output-bytes", "1048576", NULL},
                 "max_result_bytes (16777216) must not exceed max_output_bytes (1048576)");
    expect_error((const char *[]){"--pg-dsn", "x", "--max-output-total-bytes", "8388608", NULL},
                 "max_result_bytes (16777216) must not exceed max_output_total_bytes (8388608)");
    r = load(&cfg, (const char *[]){"--pg-dsn", "x", "--max-output-total-bytes", "0", NULL});
    CHECK_MSG(r.rc == 0, "%s", r.err); /* no process budget: no cross check */
    config_free(&cfg);
    result_free(&r);
    expect_error((const char *[]){"--pg-dsn", "x", "--log-level", "verbose", NULL},
                 "invalid value for log_level: 'verbose'");
    expect_error((const char *[]){"--pg-dsn", "x", "--index-engine", "hnsw", NULL},
                 "invalid value for index_engine: 'hnsw'");
    expect_error((const char *[]){"--pg-dsn", "x", "--index-faiss-factory", "NoSuchIndex", NULL},
                 "invalid value for index_faiss_factory");
    r = load(&cfg, (const char *[]){"--pg-dsn", "x", "--index-engine", "faiss",
                                    "--index-faiss-factory", "Flat", NULL});
    CHECK_MSG(r.rc == 0, "%s", r.err);
    CHECK(index_engine_parse(cfg.index_engine, strlen(cfg.index_engine)) >= 0);
    config_free(&cfg);
    result_free(&r);
}

static void test_precedence(void)
{
    char *path = write_file("# engramd settings\n"
                            "[engramd]\n"
                            "pg_dsn = dbname=fromfile\n"
                            "rpc_port = 7500\n"
                            "http_port = 7501\n"
                            "workers = 3\n");
    config cfg;
    /* the file over the defaults */
    result r = load(&cfg, (const char *[]){"--config", path, NULL});
    CHECK_MSG(r.rc == 0, "%s", r.err);
    CHECK(strcmp(cfg.pg_dsn, "dbname=fromfile") == 0 && cfg.rpc_port == 7500 && cfg.workers == 3);
    config_free(&cfg);
    result_free(&r);
    /* the environment over the file */
    setenv("ENGRAM_RPC_PORT", "7600", 1);
    r = load(&cfg, (const char *[]){"--config", path, NULL});
    CHECK(r.rc == 0 && cfg.rpc_port == 7600 && cfg.workers == 3);
    config_free(&cfg);
    result_free(&r);
    /* flags over the environment, wherever --config stands */
    r = load(&cfg, (const char *[]){"--rpc-port", "7700", "--config", path, NULL});
    CHECK(r.rc == 0 && cfg.rpc_port == 7700 && cfg.http_port == 7501);
    config_free(&cfg);
    result_free(&r);
    /* ENGRAM_CONFIG names the file; --config overrides it */
    unsetenv("ENGRAM_RPC_PORT");
    char *other = write_file("pg_dsn = dbname=other\nworkers = 5\n");
    setenv("ENGRAM_CONFIG", other, 1);
    r = load(&cfg, NULL);
    CHECK(r.rc == 0 && strcmp(cfg.pg_dsn, "dbname=other") == 0 && cfg.workers == 5);
    config_free(&cfg);
    result_free(&r);
    r = load(&cfg, (const char *[]){"--config=", NULL}); /* empty: no file at all */
    CHECK(r.rc == -EINVAL);
    CHECK_STR_CONTAINS(r.err, "pg_dsn is required");
    config_free(&cfg);
    result_free(&r);
    r = load(&cfg, (const char *[]){"--config", path, NULL});
    CHECK(r.rc == 0 && strcmp(cfg.pg_dsn, "dbname=fromfile") == 0 && cfg.workers == 3);
    config_free(&cfg);
    result_free(&r);
    unsetenv("ENGRAM_CONFIG");
    /* a bad value in the environment names the variable */
    setenv("ENGRAM_WORKERS", "many", 1);
    expect_error((const char *[]){"--pg-dsn", "x", NULL},
                 "invalid value for workers (from ENGRAM_WORKERS): 'many' is not an integer");
    /* ... unless a flag sets the same setting: the environment is still read first */
    expect_error((const char *[]){"--pg-dsn", "x", "--workers", "2", NULL}, "ENGRAM_WORKERS");
    unsetenv("ENGRAM_WORKERS");
    remove_file(other);
    remove_file(path);
}

static void test_file_errors(void)
{
    char *bad_value = write_file("pg_dsn = x\nrpc_port = 99999\n");
    char want[300];
    snprintf(want, sizeof(want), "invalid value for rpc_port (from config file %s)", bad_value);
    expect_error((const char *[]){"--config", bad_value, NULL}, want);
    remove_file(bad_value);

    char *unknown = write_file("pg_dsn = x\nrpc_prot = 1\n");
    snprintf(want, sizeof(want), "%s: unknown setting 'rpc_prot'", unknown);
    expect_error((const char *[]){"--config", unknown, NULL}, want);
    remove_file(unknown);

    char *section = write_file("[server]\npg_dsn = x\n");
    snprintf(want, sizeof(want), "%s: unknown section [server]", section);
    expect_error((const char *[]){"--config", section, NULL}, want);
    remove_file(section);

    char *syntax = write_file("pg_dsn = x\nthis line has no equals sign\n");
    snprintf(want, sizeof(want), "%s:2: syntax error", syntax);
    expect_error((const char *[]){"--config", syntax, NULL}, want);
    remove_file(syntax);

    expect_error((const char *[]){"--config", "/nonexistent/engram.ini", NULL},
                 "cannot read config file /nonexistent/engram.ini");

    /* [engram] is accepted like [engramd] */
    char *ok = write_file("[engram]\npg_dsn = x\n");
    config cfg;
    result r = load(&cfg, (const char *[]){"--config", ok, NULL});
    CHECK_MSG(r.rc == 0, "%s", r.err);
    config_free(&cfg);
    result_free(&r);
    remove_file(ok);
}

static void test_help_and_print(void)
{
    config cfg;
    result r = load(&cfg, (const char *[]){"--rpc-port", "1", "--help", NULL});
    /* --help wins before any value is checked, and prints every setting's three names */
    CHECK(r.rc == 0 && r.exit_now);
    CHECK_STR_CONTAINS(r.out, "--rpc-port");
    CHECK_STR_CONTAINS(r.out, "ENGRAM_RPC_PORT");
    CHECK_STR_CONTAINS(r.out, "--score-w-explicit");
    CHECK_STR_CONTAINS(r.out, "ENGRAM_CONFIG");
    CHECK_STR_CONTAINS(r.out, "1..65535");
    config_free(&cfg);
    result_free(&r);

    r = load(&cfg,
             (const char *[]){"--pg-dsn", "password=hunter2 dbname=x", "--rpc-port", "7999", NULL});
    CHECK(r.rc == 0);
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    config_print(&cfg, f);
    fclose(f);
    CHECK_STR_CONTAINS(text, "rpc_port = 7999\n");
    CHECK_STR_CONTAINS(text, "pg_dsn = (redacted)\n");
    CHECK_STR_CONTAINS(text, "similarity_weight = 0.7\n");
    CHECK(strstr(text, "hunter2") == NULL);
    free(text);
    config_free(&cfg);
    result_free(&r);
}

static void test_engine_names(void)
{
    int native = index_engine_parse("native", 6), faiss = index_engine_parse("faiss", 5);
    CHECK(native >= 0 && faiss >= 0 && native != faiss);
    CHECK(strcmp(index_engine_name(native), "native") == 0);
    CHECK(strcmp(index_engine_name(faiss), "faiss") == 0);
    CHECK(index_engine_parse("faiss2", 6) == -1);
    CHECK(index_engine_parse("fais", 4) == -1);
    CHECK(index_engine_parse("NATIVE", 6) == -1);
    CHECK(index_engine_parse("", 0) == -1);
}

int main(void)
{
    clear_engram_env();
    test_defaults();
    test_flag_forms();
    test_ranges_and_types();
    test_unknown_and_malformed();
    test_cross_field();
    test_precedence();
    test_file_errors();
    test_help_and_print();
    test_engine_names();
    CHECK_RETURN();
}
