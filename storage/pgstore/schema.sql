-- The table of github.com/idemkit/idem/storage/pgstore under its default
-- name, idem_keys. pgstore.Schema(name) returns this text for another name,
-- and Store.CreateTable runs it; both statements do nothing when the table
-- and its index exist. Teams that run their own migrations run this text
-- (or Schema's) as one of them.
CREATE TABLE IF NOT EXISTS idem_keys (
    -- The middleware's storage key (a hash: no client input).
    key         bytea       NOT NULL PRIMARY KEY,
    -- processing: an execution holds the lease.
    -- committed:  the execution's transaction committed with Store.Fence;
    --             its response is not stored (yet).
    -- done:       record holds the response.
    state       text        NOT NULL CHECK (state IN ('processing', 'committed', 'done')),
    -- The owner token of the execution that holds, or held, the entry.
    owner       bytea       NOT NULL,
    -- The fingerprint of the request that created the entry.
    fingerprint bytea       NOT NULL,
    -- processing: the end of the lease; committed and done: the end of the
    -- TTL. A row whose time has come is treated as absent, whether or not
    -- the janitor has deleted it yet. Judged by the database's clock.
    expires     timestamptz NOT NULL,
    -- committed: the end of the lease of the execution that committed. Until
    -- then it may still store its response, and the entry is in flight;
    -- after it, the response is taken as lost. NULL otherwise. (A table
    -- made by a development version before this column gets it with
    -- ALTER TABLE idem_keys ADD COLUMN held_until timestamptz.)
    held_until  timestamptz,
    -- done: the encoded response; NULL otherwise.
    record      bytea,
    CHECK ((state = 'done') = (record IS NOT NULL))
);

-- The janitor deletes expired rows in batches, oldest first.
CREATE INDEX IF NOT EXISTS idem_keys_expires_idx ON idem_keys (expires);
