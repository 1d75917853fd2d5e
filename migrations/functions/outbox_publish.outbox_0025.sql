CREATE OR REPLACE FUNCTION {fn}outbox_publish(
    topic text,
    key text,
    payload jsonb,
    headers jsonb DEFAULT '{{}}',
    idempotency_key text DEFAULT NULL,
    deliver_after interval DEFAULT NULL,
    traceparent text DEFAULT NULL,
    max_payload_bytes integer DEFAULT 1048576,
    wakeup boolean DEFAULT false
) RETURNS uuid
LANGUAGE plpgsql VOLATILE AS $body$
#variable_conflict use_column
DECLARE
    v_headers jsonb;
    v_topic bytea;
    v_key bytea;
    v_size bigint;
    v_id uuid;
    v_record bytea;
    h_name text;
    h_value jsonb;
BEGIN
    -- PL/pgSQL sets up each expression's execution state once per transaction, and a writer
    -- calls this once per transaction: every expression on the good path costs its setup on
    -- every call (outbox_0025). So good input runs six statements: every rule is one test
    -- here, and the statements that name the broken rule run only when one fails.
    IF topic IS NULL OR key IS NULL OR payload IS NULL
       OR btrim(topic) = '' OR octet_length(convert_to(topic, 'UTF8')) > 255
       -- outbox_check_topic's grammar, ^[A-Za-z0-9][A-Za-z0-9._/-]*$, without a regular
       -- expression (a quarter of this test's cost): every character is allowed, the first
       -- is a letter or digit
       OR ltrim(topic, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._/-') <> ''
       OR strpos('._/-', left(topic, 1)) > 0 OR lower(left(topic, 4)) = 'amq.'
       OR btrim(key) = '' OR octet_length(convert_to(key, 'UTF8')) > 1024
       OR (headers IS NOT NULL AND headers <> '{{}}'::jsonb AND (
           jsonb_typeof(headers) <> 'object'
           -- outbox/_headers.py's rules: text values; no reserved, empty or unsafe name; no
           -- CR or LF in a value
           OR jsonb_path_exists(headers, '$.keyvalue() ? (@.value.type() != "string"
                   || @.key like_regex "^(outbox-|(content-type|traceparent|payload|nats-msg-id)$)" flag "i"
                   || @.key == "" || @.key like_regex "[\x01-\x20:\x7f]"
                   || @.value like_regex "[\r\n]")', silent => true)))
       OR deliver_after < interval '0'
       -- brokers count headers against their limit too, as publish() does ('{{}}' counts 0;
       -- no CASE: its THEN would end the IF's condition)
       OR octet_length(convert_to(payload::text, 'UTF8'))
          + coalesce(nullif(octet_length(convert_to(headers::text, 'UTF8')), 2), 0)
          > max_payload_bytes
       OR btrim(idempotency_key) = ''
    THEN
        -- Validation with the words publish() uses: nothing is written on bad input.
        v_headers := coalesce(headers, '{{}}'::jsonb);
        IF topic IS NULL OR btrim(topic) = '' THEN
            RAISE EXCEPTION 'outbox_publish: topic must not be empty or blank'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_topic := convert_to(topic, 'UTF8');
        IF octet_length(v_topic) > 255 THEN
            RAISE EXCEPTION 'outbox_publish: topic is % bytes in UTF-8, above the maximum of 255',
                octet_length(v_topic) USING ERRCODE = 'invalid_parameter_value',
                HINT = 'use a shorter identifier (for example a hash of the long one)';
        END IF;
        -- outbox_check_topic's grammar, tested inline; the function says what is wrong
        IF topic !~ '^[A-Za-z0-9][A-Za-z0-9._/-]*$' OR lower(left(topic, 4)) = 'amq.' THEN
            PERFORM {fn}outbox_check_topic(topic);
        END IF;
        IF key IS NULL OR btrim(key) = '' THEN
            RAISE EXCEPTION 'outbox_publish: key must not be empty or blank'
                USING ERRCODE = 'invalid_parameter_value',
                HINT = 'the key is the ordering key, for example the aggregate id';
        END IF;
        v_key := convert_to(key, 'UTF8');
        IF octet_length(v_key) > 1024 THEN
            RAISE EXCEPTION 'outbox_publish: key is % bytes in UTF-8, above the maximum of 1024',
                octet_length(v_key) USING ERRCODE = 'invalid_parameter_value',
                HINT = 'use a shorter identifier (for example a hash of the long one)';
        END IF;
        IF payload IS NULL THEN
            RAISE EXCEPTION 'outbox_publish: payload must not be NULL'
                USING ERRCODE = 'invalid_parameter_value',
                HINT = 'pass ''null''::jsonb for a JSON null';
        END IF;
        IF jsonb_typeof(v_headers) <> 'object' THEN
            RAISE EXCEPTION 'outbox_publish: headers must be a JSON object of text values, not %',
                jsonb_typeof(v_headers) USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- Every header in one query; the loop below runs only to name the first bad one.
        IF v_headers <> '{{}}'::jsonb AND EXISTS (
            SELECT 1 FROM jsonb_each(v_headers) AS j
            WHERE jsonb_typeof(j.value) <> 'string'
               OR lower(j.key) LIKE 'outbox-%'
               OR lower(j.key) IN ('content-type', 'traceparent', 'payload', 'nats-msg-id')
               OR j.key = '' OR j.key ~ '[\x01-\x20:\x7f]'
               OR (j.value #>> '{{}}') ~ '[\r\n]'
        ) THEN
            FOR h_name, h_value IN SELECT j.key, j.value FROM jsonb_each(v_headers) AS j LOOP
                IF jsonb_typeof(h_value) <> 'string' THEN
                    RAISE EXCEPTION 'outbox_publish: headers[%] must be text, not %', h_name,
                        jsonb_typeof(h_value) USING ERRCODE = 'invalid_parameter_value',
                        HINT = 'brokers carry headers as text: convert the value to a JSON string';
                END IF;
                IF lower(h_name) LIKE 'outbox-%'
                   OR lower(h_name) IN ('content-type', 'traceparent', 'payload', 'nats-msg-id') THEN
                    RAISE EXCEPTION 'outbox_publish: headers[%] uses a name reserved for the envelope',
                        h_name USING ERRCODE = 'invalid_parameter_value',
                        HINT = 'reserved: outbox-*, content-type, traceparent, payload, nats-msg-id';
                END IF;
                IF h_name = '' OR h_name ~ '[\x01-\x20:\x7f]' THEN
                    RAISE EXCEPTION 'outbox_publish: header name % must be non-empty, without '
                        'whitespace, '':'' or control characters', quote_literal(h_name)
                        USING ERRCODE = 'invalid_parameter_value', HINT = 'for example x-tenant-id';
                END IF;
                IF (h_value #>> '{{}}') ~ '[\r\n]' THEN
                    RAISE EXCEPTION 'outbox_publish: headers[%] must not contain CR or LF', h_name
                        USING ERRCODE = 'invalid_parameter_value';
                END IF;
            END LOOP;
        END IF;
        IF deliver_after IS NOT NULL AND deliver_after < interval '0' THEN
            RAISE EXCEPTION 'outbox_publish: deliver_after must not be negative, not %',
                deliver_after USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_size := octet_length(convert_to(payload::text, 'UTF8'))
            + CASE WHEN v_headers = '{{}}'::jsonb THEN 0
                   ELSE octet_length(convert_to(v_headers::text, 'UTF8')) END;
        IF v_size > max_payload_bytes THEN
            RAISE EXCEPTION 'outbox_publish: payload of topic % is % bytes serialized (with its '
                'headers), above the maximum of %', quote_literal(topic), v_size,
                max_payload_bytes USING ERRCODE = 'invalid_parameter_value',
                HINT = 'store large data elsewhere and publish a reference to it';
        END IF;
        IF btrim(idempotency_key) = '' THEN
            RAISE EXCEPTION 'outbox_publish: idempotency_key must not be empty or blank'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;

    -- the idempotency key's id, or a UUIDv7 as outbox_uuid_v7() makes it: 48 bits of Unix
    -- milliseconds, then a random (version 4) UUID's last 80 bits with its version nibble made
    -- 7; its variant bits stay. One expression, no subquery (a subquery is a query per call).
    v_id := CASE WHEN idempotency_key IS NULL
        THEN (lpad(to_hex(floor(date_part('epoch', clock_timestamp()) * 1000)::bigint), 12, '0')
              || '7' || substr(replace(gen_random_uuid()::text, '-', ''), 14))::uuid
        ELSE {fn}outbox_idempotency_id(topic, idempotency_key) END;

    -- One row of the ledger in both capture modes (outbox_0024, docs/explanation/capture.md):
    -- the relay numbers it per (topic, key) after commit, in commit order. The record is
    -- outbox/_capture.py's format v1.
    v_record := '\x01'::bytea
        || set_byte('\x00'::bytea, 0,
                    (idempotency_key IS NOT NULL)::int + 2 * (deliver_after IS NOT NULL)::int)
        || uuid_send(v_id)
        || int8send(coalesce(floor(extract(epoch FROM clock_timestamp() + deliver_after)
                                   * 1000000)::bigint, 0))
        || int4send(octet_length(convert_to(topic, 'UTF8'))) || convert_to(topic, 'UTF8')
        || int4send(octet_length(convert_to(key, 'UTF8'))) || convert_to(key, 'UTF8')
        || '\x000000106170706c69636174696f6e2f6a736f6e'::bytea  -- 16, application/json
        || int4send(coalesce(octet_length(convert_to(traceparent, 'UTF8')), 0))
        || coalesce(convert_to(traceparent, 'UTF8'), ''::bytea)
        || int4send(octet_length(convert_to(coalesce(headers, '{{}}')::text, 'UTF8')))
        || convert_to(coalesce(headers, '{{}}')::text, 'UTF8')
        || int4send(octet_length(convert_to(payload::text, 'UTF8')))
        || convert_to(payload::text, 'UTF8');
    IF idempotency_key IS NULL THEN
        INSERT INTO {pending} (id, record) VALUES (v_id, v_record);
    ELSE
        -- the same id published again before the relay numbered it: one row (a no-op); after,
        -- the relay drops the copy (outbox_capture_known). Not for a UUIDv7: ON CONFLICT
        -- costs a speculative insertion (an extra WAL record) on every call.
        INSERT INTO {pending} (id, record) VALUES (v_id, v_record) ON CONFLICT DO NOTHING;
    END IF;
    IF wakeup THEN
        -- A NOTIFY in the transaction wakes listening relays at commit. It costs a
        -- cluster-wide lock at commit; pass wakeup => false for bulk loads (the relays poll).
        PERFORM pg_notify('outbox_wakeup_v1', '');
    END IF;
    RETURN v_id;
END
$body$
