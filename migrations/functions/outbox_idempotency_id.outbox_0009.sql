CREATE OR REPLACE FUNCTION {fn}outbox_idempotency_id(topic text, idempotency_key text) RETURNS uuid
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $body$
    -- UUIDv5 in the namespace publish() uses (outbox._ids.IDEMPOTENCY_NAMESPACE), of
    -- topic, NUL, key in UTF-8: the id publish(..., idempotency_key=...) derives.
    SELECT encode(
        set_byte(set_byte(digest, 6, (get_byte(digest, 6) & 15) | 80),
                 8, (get_byte(digest, 8) & 63) | 128),
        'hex')::uuid
    FROM (
        SELECT substring({fn}outbox_sha1(
            '\x5b1f6d0e8f6b4c8e9a570b0c5e11e7a1'::bytea || convert_to(topic, 'UTF8')
            || '\x00'::bytea || convert_to(idempotency_key, 'UTF8')) FROM 1 FOR 16) AS digest
    ) AS s
$body$
