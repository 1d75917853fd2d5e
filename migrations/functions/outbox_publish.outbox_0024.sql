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
    v_payload bytea;
    v_size bigint;
    v_id uuid;
    h_name text;
    h_value jsonb;
BEGIN
    -- Validation first, with the words publish() uses: nothing is written on bad input.
    IF topic IS NULL OR btrim(topic) = '' THEN
        RAISE EXCEPTION 'outbox_publish: topic must not be empty or blank'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(topic) > 255 THEN
        RAISE EXCEPTION 'outbox_publish: topic is % bytes in UTF-8, above the maximum of 255',
            octet_length(topic) USING ERRCODE = 'invalid_parameter_value',
            HINT = 'use a shorter identifier (for example a hash of the long one)';
    END IF;
    PERFORM {fn}outbox_check_topic(topic);
    IF key IS NULL OR btrim(key) = '' THEN
        RAISE EXCEPTION 'outbox_publish: key must not be empty or blank'
            USING ERRCODE = 'invalid_parameter_value',
            HINT = 'the key is the ordering key, for example the aggregate id';
    END IF;
    IF octet_length(key) > 1024 THEN
        RAISE EXCEPTION 'outbox_publish: key is % bytes in UTF-8, above the maximum of 1024',
            octet_length(key) USING ERRCODE = 'invalid_parameter_value',
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
    IF deliver_after IS NOT NULL AND deliver_after < interval '0' THEN
        RAISE EXCEPTION 'outbox_publish: deliver_after must not be negative, not %',
            deliver_after USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_payload := convert_to(payload::text, 'UTF8');
    -- Brokers count headers against their limit too, as publish() does.
    v_size := octet_length(v_payload)
        + CASE WHEN v_headers = '{{}}'::jsonb THEN 0
               ELSE octet_length(convert_to(v_headers::text, 'UTF8')) END;
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
        v_id := {fn}outbox_uuid_v7();
    END IF;

    -- One row of the ledger in both capture modes (outbox_0024, docs/explanation/capture.md):
    -- the relay numbers it per (topic, key) after commit, in commit order. An idempotency key
    -- published again before the relay recorded the first is a conflict (a no-op); after, the
    -- relay drops the copy (outbox_capture_known).
    INSERT INTO {pending} (id, record) VALUES (v_id,
        '\x01'::bytea
        || set_byte('\x00'::bytea, 0,
                    (idempotency_key IS NOT NULL)::int
                    + 2 * (deliver_after IS NOT NULL)::int)
        || uuid_send(v_id)
        || int8send(CASE WHEN deliver_after IS NULL THEN 0 ELSE floor(extract(epoch FROM
               clock_timestamp() + deliver_after) * 1000000)::bigint END)
        || int4send(octet_length(convert_to(topic, 'UTF8'))) || convert_to(topic, 'UTF8')
        || int4send(octet_length(convert_to(key, 'UTF8'))) || convert_to(key, 'UTF8')
        || int4send(16) || convert_to('application/json', 'UTF8')
        || int4send(coalesce(octet_length(convert_to(traceparent, 'UTF8')), 0))
        || coalesce(convert_to(traceparent, 'UTF8'), ''::bytea)
        || int4send(octet_length(convert_to(v_headers::text, 'UTF8')))
        || convert_to(v_headers::text, 'UTF8')
        || int4send(octet_length(v_payload)) || v_payload)
    ON CONFLICT DO NOTHING;
    IF wakeup THEN
        -- A NOTIFY in the transaction wakes listening relays at commit. It costs a
        -- cluster-wide lock at commit; pass wakeup => false for bulk loads (the relays poll).
        PERFORM pg_notify('outbox_wakeup_v1', '');
    END IF;
    RETURN v_id;
END
$body$
