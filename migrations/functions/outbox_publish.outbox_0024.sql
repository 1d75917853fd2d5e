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
    v_headers jsonb := coalesce(headers, '{{}}'::jsonb);
    v_topic bytea;
    v_key bytea;
    v_headers_text bytea;
    v_trace bytea;
    v_record bytea;
    v_payload bytea;
    v_size bigint;
    v_id uuid;
    v_random bytea;
    h_name text;
    h_value jsonb;
BEGIN
    -- Validation first, with the words publish() uses: nothing is written on bad input. The
    -- common case (good input) costs one test per rule; the words come from the slower checks
    -- that run only when a rule fails.
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
    v_payload := convert_to(payload::text, 'UTF8');
    v_headers_text := convert_to(v_headers::text, 'UTF8');
    -- Brokers count headers against their limit too, as publish() does.
    v_size := octet_length(v_payload)
        + CASE WHEN v_headers = '{{}}'::jsonb THEN 0 ELSE octet_length(v_headers_text) END;
    IF v_size > max_payload_bytes THEN
        RAISE EXCEPTION 'outbox_publish: payload of topic % is % bytes serialized (with its '
            'headers), above the maximum of %', quote_literal(topic), v_size, max_payload_bytes
            USING ERRCODE = 'invalid_parameter_value',
            HINT = 'store large data elsewhere and publish a reference to it';
    END IF;

    IF idempotency_key IS NOT NULL THEN
        IF btrim(idempotency_key) = '' THEN
            RAISE EXCEPTION 'outbox_publish: idempotency_key must not be empty or blank'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_id := {fn}outbox_idempotency_id(topic, idempotency_key);
    ELSE
        -- a UUIDv7 as outbox_uuid_v7() makes it, from one random UUID: 48 bits of Unix
        -- milliseconds, the version, the variant, 74 random bits (RFC 9562)
        v_random := uuid_send(gen_random_uuid());
        v_id := encode(set_byte(set_byte(
            overlay(v_random PLACING substring(int8send(floor(
                extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3) FROM 1 FOR 6),
            6, (get_byte(v_random, 6) & 15) | 112),
            8, (get_byte(v_random, 8) & 63) | 128), 'hex')::uuid;
    END IF;

    -- One row of the ledger in both capture modes (outbox_0024, docs/explanation/capture.md):
    -- the relay numbers it per (topic, key) after commit, in commit order. The record is
    -- outbox/_capture.py's format v1.
    v_trace := coalesce(convert_to(traceparent, 'UTF8'), ''::bytea);
    v_record := '\x01'::bytea
        || set_byte('\x00'::bytea, 0,
                    (idempotency_key IS NOT NULL)::int + 2 * (deliver_after IS NOT NULL)::int)
        || uuid_send(v_id)
        || int8send(CASE WHEN deliver_after IS NULL THEN 0 ELSE floor(extract(epoch FROM
               clock_timestamp() + deliver_after) * 1000000)::bigint END)
        || int4send(octet_length(v_topic)) || v_topic
        || int4send(octet_length(v_key)) || v_key
        || '\x000000106170706c69636174696f6e2f6a736f6e'::bytea  -- 16, application/json
        || int4send(octet_length(v_trace)) || v_trace
        || int4send(octet_length(v_headers_text)) || v_headers_text
        || int4send(octet_length(v_payload)) || v_payload;
    IF idempotency_key IS NULL THEN
        INSERT INTO {pending} (id, record) VALUES (v_id, v_record);
    ELSE
        -- the same id published again before the relay numbered it: one row (a no-op); after,
        -- the relay drops the copy (outbox_capture_known)
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
