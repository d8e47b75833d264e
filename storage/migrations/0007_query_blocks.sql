-- Query admission from blocks reserved per engramd worker (issue 18).
--
-- A tier's daily query limit was enforced by one locked counter row per tenant and day,
-- written by every search. Now each engramd worker (a holder) reserves a block of the day's
-- queries at a time and admits from it with no round trip; tenant_usage.queries counts the
-- queries reported used, and this table what each holder holds: reserved and neither
-- reported used nor returned. A reservation is granted only while
-- used + every holder's block <= the limit, under the counter row's lock, so no number of
-- processes ever admits more than the limit. A holder reports what it used and returns the
-- rest when it refills, when its block idles or ages, and at shutdown; a block whose holder
-- vanished (a crash) expires and then counts as used, never as free (see
-- engram_query_reserve).
CREATE TABLE tenant_query_blocks (
    tenant_id   bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    day         date NOT NULL,
    holder      text NOT NULL,
    held        bigint NOT NULL CHECK (held > 0),
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, day, holder)
);
ALTER TABLE tenant_query_blocks ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_rows ON tenant_query_blocks USING (tenant_id = engram_current_tenant());
GRANT SELECT, INSERT, UPDATE, DELETE ON tenant_query_blocks TO engram_app;
