-- storage/citus/10_tables.sql: the tables on a Citus cluster (docs/scaling.md). Applied by
-- migrate.c through the coordinator after the migrations and the function files, whenever
-- the database has the citus extension; never on a single PostgreSQL. Idempotent: it runs in
-- one transaction at every start and does only what is not done yet, so a table a later
-- migration adds is distributed, and a function a changed function file re-created is
-- distributed again.
--
-- - Every table with a tenant_id column is distributed by it and co-located with tenants
--   (distributed by id): a tenant's rows of every table sit in one shard group on one node,
--   so a function that touches only p_tenant's rows runs there as one local transaction.
-- - Tables without tenant_id (engram_instance, schema_migrations, schema_functions) become
--   reference tables (a copy on every node): an engramd connected to a worker reads there
--   which schema the coordinator applied (migrate.c check_on_worker).
-- - Every function with a bigint argument p_tenant is distributed with p_tenant as its
--   distribution argument, co-located with tenants, delegated even inside a transaction
--   block (engramd sets engram.tenant_id and calls the function in one transaction).
-- - Citus refuses a unique constraint that does not include the distribution column:
--   tenants.name (engram_admin_tenant_create checks names under a lock instead: see below)
--   and api_keys (key row, key_id) become (tenant_id, id) plus plain indexes.

-- Every statement sits in a DO block: Citus passes a utility statement on to the workers as
-- the text of the whole query string it came in, and migrate.c sends this file as one.

-- The coordinator reaches the workers as the user a query runs as: engram_app (engramd's SET
-- ROLE) must be able to log in there. How it authenticates between nodes is the cluster's
-- business (loopback trust in deploy/citus; pg_dist_authinfo or .pgpass elsewhere:
-- docs/scaling.md). It still owns nothing and bypasses no policy. Foreign keys between
-- distributed tables created in one transaction need sequential shard commands.
DO $$
BEGIN
    PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
    ALTER ROLE engram_app LOGIN;
    -- A database moved onto Citus (a single PostgreSQL's dump restored into the coordinator,
    -- docs/scaling.md) holds rows when its tables are distributed: create_distributed_table
    -- copies them into the shards, and the copy would fire the tables' triggers on the
    -- workers (audit records, counters: the rows already hold their effects) before the
    -- tables they write to exist there. Replica mode fires none, in this transaction only.
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'tenants'::regclass)
       AND EXISTS (SELECT 1 FROM ONLY tenants) THEN
        SET LOCAL session_replication_role = replica;
    END IF;
END $$;

-- Unique constraints Citus cannot keep, replaced by indexes for the lookups.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'tenants'::regclass) THEN
        ALTER TABLE tenants DROP CONSTRAINT IF EXISTS tenants_name_key;
        CREATE INDEX IF NOT EXISTS tenants_name ON tenants (name);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'api_keys'::regclass) THEN
        ALTER TABLE api_keys DROP CONSTRAINT IF EXISTS api_keys_key_id_key;
        ALTER TABLE api_keys DROP CONSTRAINT IF EXISTS api_keys_pkey;
        ALTER TABLE api_keys ADD PRIMARY KEY (tenant_id, id);
        CREATE INDEX IF NOT EXISTS api_keys_key_id ON api_keys (key_id);
    END IF;
END $$;

-- Tables: tenants first, then every table with tenant_id once the tables it refers to are
-- distributed (foreign keys between distributed tables need both sides distributed), then
-- the reference tables.
DO $$
DECLARE
    r record;
    left_over integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'tenants'::regclass) THEN
        PERFORM create_distributed_table('tenants', 'id');
    END IF;
    LOOP
        left_over := 0;
        FOR r IN
            SELECT c.oid::regclass AS rel,
                   NOT EXISTS (SELECT 1 FROM pg_constraint f
                                WHERE f.conrelid = c.oid AND f.contype = 'f'
                                  AND f.confrelid <> c.oid
                                  AND f.confrelid NOT IN (SELECT logicalrelid
                                                            FROM pg_dist_partition)) AS ready
              FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'public' AND c.relkind = 'r'
               AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid
                              AND a.attname = 'tenant_id' AND NOT a.attisdropped)
               AND c.oid NOT IN (SELECT logicalrelid FROM pg_dist_partition)
             ORDER BY c.relname
        LOOP
            IF r.ready THEN
                PERFORM create_distributed_table(r.rel::text, 'tenant_id',
                                                 colocate_with => 'tenants');
            ELSE
                left_over := left_over + 1;
            END IF;
        END LOOP;
        EXIT WHEN left_over = 0;
    END LOOP;
    FOR r IN
        SELECT c.oid::regclass AS rel
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'public' AND c.relkind = 'r'
           AND c.oid NOT IN (SELECT logicalrelid FROM pg_dist_partition)
    LOOP
        PERFORM create_reference_table(r.rel::text);
        -- the rows now live in the reference table's shards
        PERFORM truncate_local_data_after_distributing_table(r.rel);
    END LOOP;
    -- the same for the distributed tables that held rows (a database moved onto Citus):
    -- their rows are in the shards now, the coordinator's local copies go. Only those with
    -- local storage (a query, ONLY or not, would read the shards), in the transaction that
    -- distributed them, whose replica mode keeps the tables' TRUNCATE guards (the audit
    -- log's) from firing.
    IF current_setting('session_replication_role') = 'replica' THEN
        FOR r IN SELECT logicalrelid AS rel FROM pg_dist_partition WHERE partmethod = 'h'
                  ORDER BY logicalrelid LOOP
            IF pg_relation_size(r.rel) > 0 THEN
                PERFORM truncate_local_data_after_distributing_table(r.rel);
            END IF;
        END LOOP;
    END IF;
END $$;
