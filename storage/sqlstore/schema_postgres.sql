-- The table of github.com/idemkit/idem/storage/sqlstore for PostgreSQL 12+,
-- under its default name, idem_keys. sqlstore.Schema(sqlstore.PostgreSQL,
-- name) returns this text for another name, and Store.CreateTable runs it
-- (after an advisory lock that keeps instances starting together from
-- tripping over each other); it does nothing when the table and its
-- indexes exist. Teams that run their own migrations run this text (or
-- Schema's).
--
-- Times are bigint microseconds since the Unix epoch by the server's clock
-- (statement_timestamp()): no TimeZone setting changes what they mean.
CREATE TABLE IF NOT EXISTS "idem_keys" (
    -- The middleware's storage key (a hash: no client input). bytea:
    -- compared byte for byte, whatever the database's collation.
    key         bytea  NOT NULL PRIMARY KEY,
    -- issued:     Store.Issue made the key; no execution has taken it.
    -- processing: an execution holds the lease.
    -- committed:  the execution's transaction committed with Store.Fence;
    --             its response is not stored (yet).
    -- done:       record holds the response.
    state       text   NOT NULL,
    -- The owner token of the execution that holds, or held, the entry
    -- (done: the one that completed it); empty when issued.
    owner       bytea  NOT NULL,
    -- The fingerprint of the request that created the entry; empty when
    -- issued.
    fingerprint bytea  NOT NULL,
    -- issued: the end of the issue's TTL; processing: the end of the lease;
    -- committed and done: the end of the TTL. A row whose time has come is
    -- treated as absent, whether or not the janitor has deleted it yet.
    expires     bigint NOT NULL,
    -- committed: the end of the lease of the execution that committed;
    -- NULL otherwise.
    held_until  bigint NULL,
    -- done: the encoded response; NULL otherwise. At most 1 GB (a field's
    -- limit in PostgreSQL).
    record      bytea  NULL,
    -- issued, and processing when taken from an issue: the issue's TTL in
    -- milliseconds; NULL otherwise.
    issue_ttl   bigint NULL,
    -- When the entry entered its state (issued, acquired, done).
    since       bigint NOT NULL,
    CONSTRAINT idem_keys_state_check CHECK (state IN ('issued', 'processing', 'committed', 'done')),
    CONSTRAINT idem_keys_record_check CHECK ((state = 'done') = (record IS NOT NULL)),
    CONSTRAINT idem_keys_issue_check CHECK (state IN ('issued', 'processing') OR issue_ttl IS NULL),
    CONSTRAINT idem_keys_issued_check CHECK (state <> 'issued' OR issue_ttl IS NOT NULL)
);
-- The janitor deletes expired rows in batches, oldest first.
CREATE INDEX IF NOT EXISTS idem_keys_expires_idx ON "idem_keys" (expires);
-- Store.List pages through the entries of one state, oldest first.
CREATE INDEX IF NOT EXISTS idem_keys_state_since_idx ON "idem_keys" (state, since, key);
