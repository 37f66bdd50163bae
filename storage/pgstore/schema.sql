-- The table of github.com/idemkit/idem/storage/pgstore under its default
-- name, idem_keys. pgstore.Schema(name) returns this text for another name,
-- and Store.CreateTable runs it; both statements do nothing when the table
-- and its index exist. Teams that run their own migrations run this text
-- (or Schema's) as one of them.
CREATE TABLE IF NOT EXISTS idem_keys (
    -- The middleware's storage key (a hash: no client input).
    key         bytea       NOT NULL PRIMARY KEY,
    -- issued:     Store.Issue made the key; no execution has taken it.
    -- processing: an execution holds the lease.
    -- committed:  the execution's transaction committed with Store.Fence;
    --             its response is not stored (yet).
    -- done:       record holds the response.
    state       text        NOT NULL CHECK (state IN ('issued', 'processing', 'committed', 'done')),
    -- The owner token of the execution that holds, or held, the entry
    -- (done: the one that completed it; only its Complete is a resend);
    -- empty when issued.
    owner       bytea       NOT NULL,
    -- The fingerprint of the request that created the entry; empty when
    -- issued.
    fingerprint bytea       NOT NULL,
    -- issued: the end of the issue's TTL; processing: the end of the lease;
    -- committed and done: the end of the TTL. A row whose time has come is
    -- treated as absent, whether or not the janitor has deleted it yet.
    -- Judged by the database's clock.
    expires     timestamptz NOT NULL,
    -- committed: the end of the lease of the execution that committed. Until
    -- then it may still store its response, and the entry is in flight;
    -- after it, the response is taken as lost. NULL otherwise. (A table
    -- made by a development version before this column gets it with
    -- ALTER TABLE idem_keys ADD COLUMN held_until timestamptz.)
    held_until  timestamptz,
    -- done: the encoded response; NULL otherwise.
    record      bytea,
    -- issued, and processing when taken from an issue: the issue's TTL in
    -- milliseconds, for which Store.Release makes the entry issued again;
    -- NULL otherwise.
    issue_ttl   bigint      CHECK (issue_ttl > 0),
    -- When the entry entered its state, by the database's clock: issued
    -- (or back to issued), acquired by the execution that holds it (in
    -- processing and committed), done. Renewals keep it. NULL in rows
    -- written by a version before it (added below to a table made by one).
    since       timestamptz,
    CHECK ((state = 'done') = (record IS NOT NULL)),
    CHECK (state IN ('issued', 'processing') OR issue_ttl IS NULL),
    CHECK (state <> 'issued' OR issue_ttl IS NOT NULL)
);
-- A table made by the version before issued keys gets the state and the
-- column with these statements (idem_keys_state_check is the name that
-- PostgreSQL gave the CHECK on state: the table's name and _state_check):
--
-- ALTER TABLE idem_keys
--     ADD COLUMN issue_ttl bigint CHECK (issue_ttl > 0),
--     DROP CONSTRAINT idem_keys_state_check,
--     ADD CONSTRAINT idem_keys_state_check CHECK (state IN ('issued', 'processing', 'committed', 'done')),
--     ADD CHECK (state IN ('issued', 'processing') OR issue_ttl IS NULL),
--     ADD CHECK (state <> 'issued' OR issue_ttl IS NOT NULL);
--
-- Every version of the store from this one on needs them: its statements
-- name the column. The version before runs on the altered table as long as
-- no key is issued.

-- The janitor deletes expired rows in batches, oldest first.
CREATE INDEX IF NOT EXISTS idem_keys_expires_idx ON idem_keys (expires);

-- A table made by a version before the since column gets it here, only
-- when it lacks it (ALTER TABLE takes a lock that would queue behind every
-- transaction on the table even when there is nothing to add). Versions
-- before it run on the altered table: they leave since NULL.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_attribute
                   WHERE attrelid = 'idem_keys'::regclass AND attname = 'since' AND NOT attisdropped) THEN
        ALTER TABLE idem_keys ADD COLUMN since timestamptz;
    END IF;
END
$$;

-- Store.List pages through the entries of one state, oldest first. On a
-- large table made by an older version, create it beforehand with CREATE
-- INDEX CONCURRENTLY (same name and columns), which does not block
-- writes: here it would, for as long as it takes to build.
CREATE INDEX IF NOT EXISTS idem_keys_state_since_idx ON idem_keys (state, coalesce(since, '-infinity'::timestamptz), key);
