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
