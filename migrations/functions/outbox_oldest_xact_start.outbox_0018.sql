-- The horizon's open-transaction bound (spark_ingest/statements.sql horizon), without the
-- query text: only the start time leaves the function. pg_backend_pid() is the caller's.
CREATE OR REPLACE FUNCTION {fn}outbox_oldest_xact_start() RETURNS timestamptz
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $body$
BEGIN
    IF NOT (SELECT r.rolsuper FROM pg_roles AS r WHERE r.rolname = current_user)
       AND NOT pg_has_role(current_user, 'pg_read_all_stats', 'USAGE') THEN
        RAISE EXCEPTION 'outbox_oldest_xact_start: its owner % sees only its own sessions',
            current_user USING ERRCODE = 'insufficient_privilege',
            HINT = 'GRANT pg_read_all_stats TO the role that ran the migrations (the owner of '
                   'this function), or re-create it as a superuser';
    END IF;
    RETURN (SELECT min(a.xact_start) FROM pg_stat_activity AS a
            WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
              AND a.backend_type = 'client backend' AND a.xact_start IS NOT NULL);
END
$body$
