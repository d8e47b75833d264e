-- 0010_model_usage: a chat model in consolidation (issue 32): what it costs each tenant per
-- day, and each tenant's choice of model.
--
-- tenant_usage (one row per tenant and UTC day) gains the model's calls, tokens and cost as
-- the provider reported them; the tier's daily token cap (free_model_tokens_per_day, ...)
-- is checked against model_tokens_in + model_tokens_out of the day. tenants.chat_model is
-- the tenant's override of the server's model: NULL uses the server's (llm_model), 'none'
-- keeps the tenant on the no-model path, any other value is the model name sent to the
-- server's provider (admin.tenant.update chat_model).
ALTER TABLE tenant_usage
    ADD COLUMN model_calls      bigint NOT NULL DEFAULT 0,
    ADD COLUMN model_tokens_in  bigint NOT NULL DEFAULT 0,
    ADD COLUMN model_tokens_out bigint NOT NULL DEFAULT 0,
    ADD COLUMN model_cost_usd   double precision NOT NULL DEFAULT 0;
ALTER TABLE tenants
    ADD COLUMN chat_model text CHECK (chat_model IS NULL OR length(chat_model) BETWEEN 1 AND 128);

-- The pairs a chat model has judged and left as they were (distinct, contradicting, or not
-- named in a group it judged), with a hash of each memory's normalized text then: a later
-- run does not ask about the pair again until one of the two texts changes, so a daily run
-- pays for what is new, not for the whole store again.
CREATE TABLE consolidation_judged (
    tenant_id  bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    a          bigint NOT NULL,   -- the lower memory id
    b          bigint NOT NULL,
    ha         bigint NOT NULL,   -- the texts' hashes when judged
    hb         bigint NOT NULL,
    judged_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, a, b)
);
ALTER TABLE consolidation_judged ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_rows ON consolidation_judged USING (tenant_id = engram_current_tenant());
GRANT SELECT, INSERT, UPDATE, DELETE ON consolidation_judged TO engram_app;
