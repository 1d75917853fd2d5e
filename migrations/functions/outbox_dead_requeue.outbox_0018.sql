-- The console's requeue (relay/statements.sql dead_retry, for given ids): only rows still dead
-- change; FOR UPDATE so two operators audit each message once; the write counter's number per
-- requeued row wakes watching relays (relay/_watch.py).
CREATE OR REPLACE FUNCTION {fn}outbox_dead_requeue(p_ids uuid[], p_actor text, p_reason text)
RETURNS SETOF uuid
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $body$
WITH picked AS MATERIALIZED (
    SELECT id FROM {fn}outbox_messages WHERE id = ANY(p_ids) AND status = 'dead'
    ORDER BY topic, key, seq FOR UPDATE
),
changed AS (
    UPDATE {fn}outbox_messages AS m
    SET status = 'pending', attempts = 0, available_at = clock_timestamp(),
        lease_owner = NULL, lease_token = NULL, lease_until = NULL
    FROM picked WHERE m.id = picked.id AND m.status = 'dead'
    RETURNING m.id, m.topic, m.key, m.seq, m.last_error, nextval('{counter}') AS watch
)
INSERT INTO {fn}outbox_dead_audit (actor, action, message_id, topic, key, seq, last_error, reason)
SELECT p_actor, 'retry', id, topic, key, seq, last_error, p_reason FROM changed
RETURNING message_id
$body$
