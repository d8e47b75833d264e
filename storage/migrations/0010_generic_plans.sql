-- 0010_generic_plans: the functions that look memories up by lists of ids plan with the
-- tenant as a parameter.
--
-- With the tenant's value in hand, PostgreSQL estimates a tenant its statistics have not
-- seen yet (every tenant id is in the column's most-common-values list, so a new one gets
-- one row) and may plan "tenant_id = p_tenant AND id = ANY (p_ids)" as a scan of the whole
-- tenant with the ids as a filter (see 0008 and 0009). A generic plan does not know the
-- value, estimates the average tenant, and looks the ids up on the primary key. The
-- server's own statements do the same with "tenant_id = (SELECT $1)" (storage/sql.c,
-- storage/loader.c).
ALTER FUNCTION engram_memory_delete(bigint, bigint[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION engram_memory_set_archived(bigint, bigint[], boolean, text)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION engram_consolidate_apply(bigint, bigint[], bigint[], bigint[], text[], text[],
    bigint[], bigint[], bigint[], bigint[], bigint[], bigint[], double precision[])
    SET plan_cache_mode = force_generic_plan;
