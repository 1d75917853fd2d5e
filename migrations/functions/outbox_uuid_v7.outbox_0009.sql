CREATE OR REPLACE FUNCTION {fn}outbox_uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $body$
    -- 48 bits of Unix milliseconds, version 7, the variant bits, 74 random bits (RFC 9562).
    SELECT encode(
        set_byte(set_byte(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send(floor(
                        extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            6, (get_byte(uuid_send(gen_random_uuid()), 6) & 15) | 112),
            8, (get_byte(uuid_send(gen_random_uuid()), 8) & 63) | 128),
        'hex')::uuid
$body$
