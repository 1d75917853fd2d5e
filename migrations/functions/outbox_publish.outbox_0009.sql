CREATE OR REPLACE FUNCTION {fn}outbox_publish(
    topic text,
    key text,
    payload jsonb,
    headers jsonb DEFAULT '{{}}',
    idempotency_key text DEFAULT NULL,
    deliver_after interval DEFAULT NULL,
    traceparent text DEFAULT NULL,
    max_payload_bytes integer DEFAULT 1048576,
    wakeup boolean DEFAULT true
) RETURNS uuid
LANGUAGE plpgsql VOLATILE AS $body$
#variable_conflict use_column
DECLARE
    v_headers jsonb := coalesce(headers, '{{}}'::jsonb);
    v_payload bytea;
    v_size bigint;
    v_id uuid;
    v_seq bigint;
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
        -- The lock order of publish() (outbox_idempotency_lock): the key's counter row
        -- first, then the advisory lock of the derived id (class 3084 = 0x0C0C, the first
        -- four bytes of the id as a signed int4), so SQL and Python writers cannot deadlock.
        INSERT INTO {messages_seq} AS s (topic, key, last_seq)
        VALUES (outbox_publish.topic, outbox_publish.key, 0)
        ON CONFLICT (topic, key) DO UPDATE SET last_seq = s.last_seq;
        PERFORM pg_advisory_xact_lock(
            3084, ('x' || left(replace(v_id::text, '-', ''), 8))::bit(32)::int4);
        IF EXISTS (SELECT 1 FROM {messages} AS e WHERE e.id = v_id) THEN
            RETURN v_id;  -- published already: a no-op, the same id
        END IF;
    ELSE
        v_id := {fn}outbox_uuid_v7();
    END IF;

    -- outbox_messages_insert_one: the counter row's lock orders same-key writers until
    -- commit, so seqs are gapless and in commit order (see outbox/_statements.py).
    INSERT INTO {messages_seq} AS s (topic, key, last_seq)
    VALUES (outbox_publish.topic, outbox_publish.key, 1)
    ON CONFLICT (topic, key) DO UPDATE SET last_seq = s.last_seq + 1
    RETURNING s.last_seq INTO v_seq;
    INSERT INTO {messages}
        (id, topic, key, seq, headers, payload, content_type, traceparent, available_at)
    VALUES (v_id, outbox_publish.topic, outbox_publish.key, v_seq, v_headers, v_payload,
            'application/json', outbox_publish.traceparent,
            clock_timestamp() + coalesce(deliver_after, interval '0'));
    IF wakeup THEN
        -- A NOTIFY in the transaction wakes listening relays at commit. It costs a
        -- cluster-wide lock at commit; pass wakeup => false for bulk loads (the relays poll).
        PERFORM pg_notify('outbox_wakeup_v1', '');
    END IF;
    RETURN v_id;
END
$body$
