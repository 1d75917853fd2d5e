-- The console's purge (relay/statements.sql dead_purge, for given ids): only rows still dead
-- go; FOR UPDATE so two operators audit each message once.
CREATE OR REPLACE FUNCTION {fn}outbox_dead_purge(p_ids uuid[], p_actor text, p_reason text)
RETURNS SETOF uuid
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $body$
WITH picked AS MATERIALIZED (
    SELECT id FROM {fn}outbox_messages WHERE id = ANY(p_ids) AND status = 'dead'
    ORDER BY topic, key, seq FOR UPDATE
),
gone AS (
    DELETE FROM {fn}outbox_messages AS m USING picked
    WHERE m.id = picked.id AND m.status = 'dead'
    RETURNING m.id, m.topic, m.key, m.seq, m.last_error
)
INSERT INTO {fn}outbox_dead_audit (actor, action, message_id, topic, key, seq, last_error, reason)
SELECT p_actor, 'purge', id, topic, key, seq, last_error, p_reason FROM gone
RETURNING message_id
$body$
