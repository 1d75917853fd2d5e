CREATE OR REPLACE FUNCTION {fn}outbox_sha1(data bytea) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $body$
-- SHA-1 (FIPS 180-4) on 32-bit words kept in bigints. Only for UUIDv5 ids, never for security.
DECLARE
    h bigint[] := ARRAY[x'67452301'::bigint, x'EFCDAB89'::bigint, x'98BADCFE'::bigint,
                        x'10325476'::bigint, x'C3D2E1F0'::bigint];
    m bytea := data || '\x80'::bytea;
    w bigint[];
    a bigint; b bigint; c bigint; d bigint; e bigint; f bigint; k bigint; t bigint;
    mask CONSTANT bigint := 4294967295;
    base int;
BEGIN
    WHILE octet_length(m) % 64 <> 56 LOOP
        m := m || '\x00'::bytea;
    END LOOP;
    m := m || int8send(octet_length(data)::bigint * 8);
    FOR blk IN 0 .. octet_length(m) / 64 - 1 LOOP
        base := blk * 64;
        w := array_fill(0::bigint, ARRAY[80]);
        FOR i IN 0 .. 15 LOOP
            w[i + 1] := (get_byte(m, base + i * 4)::bigint << 24)
                      | (get_byte(m, base + i * 4 + 1)::bigint << 16)
                      | (get_byte(m, base + i * 4 + 2)::bigint << 8)
                      | get_byte(m, base + i * 4 + 3)::bigint;
        END LOOP;
        FOR i IN 16 .. 79 LOOP
            t := w[i - 2] # w[i - 7] # w[i - 13] # w[i - 15];
            w[i + 1] := ((t << 1) | (t >> 31)) & mask;
        END LOOP;
        a := h[1]; b := h[2]; c := h[3]; d := h[4]; e := h[5];
        FOR i IN 0 .. 79 LOOP
            IF i < 20 THEN
                f := (b & c) | ((b # mask) & d); k := x'5A827999'::bigint;
            ELSIF i < 40 THEN
                f := b # c # d; k := x'6ED9EBA1'::bigint;
            ELSIF i < 60 THEN
                f := (b & c) | (b & d) | (c & d); k := x'8F1BBCDC'::bigint;
            ELSE
                f := b # c # d; k := x'CA62C1D6'::bigint;
            END IF;
            t := ((((a << 5) | (a >> 27)) & mask) + f + e + k + w[i + 1]) & mask;
            e := d; d := c; c := ((b << 30) | (b >> 2)) & mask; b := a; a := t;
        END LOOP;
        h[1] := (h[1] + a) & mask; h[2] := (h[2] + b) & mask; h[3] := (h[3] + c) & mask;
        h[4] := (h[4] + d) & mask; h[5] := (h[5] + e) & mask;
    END LOOP;
    RETURN substring(int8send(h[1]) FROM 5) || substring(int8send(h[2]) FROM 5)
        || substring(int8send(h[3]) FROM 5) || substring(int8send(h[4]) FROM 5)
        || substring(int8send(h[5]) FROM 5);
END
$body$
