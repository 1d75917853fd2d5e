-- The same rules as outbox/_topic.py. The bracket ranges are ASCII code points in
-- PostgreSQL's regex engine, whatever the collation. IMMUTABLE: it reads nothing.
CREATE OR REPLACE FUNCTION {fn}outbox_check_topic(topic text) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $body$
BEGIN
    IF topic IS NULL OR topic = '' THEN
        RAISE EXCEPTION 'outbox_publish: topic must not be empty'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF length(topic) > 255 THEN
        RAISE EXCEPTION 'outbox_publish: topic is % characters, above the maximum of 255',
            length(topic) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF topic !~ '^[A-Za-z0-9][A-Za-z0-9._/-]*$' THEN
        RAISE EXCEPTION 'outbox_publish: topic % is not a name', quote_literal(left(topic, 80))
            USING ERRCODE = 'invalid_parameter_value',
            HINT = 'use ASCII letters, digits, ''.'', ''-'', ''_'', ''/'', starting with a '
                   'letter or digit; the relay''s configuration maps a topic to a broker '
                   'destination, a topic is never a broker address';
    END IF;
    IF lower(topic) LIKE 'amq.%' THEN
        RAISE EXCEPTION 'outbox_publish: topic % starts with ''amq.'', a prefix a broker '
            'reserves', quote_literal(left(topic, 80))
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$body$
