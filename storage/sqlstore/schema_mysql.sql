-- The table of github.com/idemkit/idem/storage/sqlstore for MySQL 8.0+ and
-- MariaDB 10.6+, under its default name, idem_keys. sqlstore.Schema(
-- sqlstore.MySQL, name) returns this text for another name, and
-- Store.CreateTable runs it; it does nothing when the table exists.
-- Teams that run their own migrations run this text (or Schema's).
--
-- Times are BIGINT microseconds since the Unix epoch by the server's clock
-- in UTC (UTC_TIMESTAMP(6)): no session time zone, DST change or driver
-- setting (parseTime, loc) changes what they mean.
CREATE TABLE IF NOT EXISTS `idem_keys` (
    -- The middleware's storage key (a hash: no client input). Binary: no
    -- collation folds "Key" and "key" together, or trims trailing spaces.
    `key`       VARBINARY(255) NOT NULL,
    -- issued:     Store.Issue made the key; no execution has taken it.
    -- processing: an execution holds the lease.
    -- committed:  the execution's transaction committed with Store.Fence;
    --             its response is not stored (yet).
    -- done:       record holds the response.
    state       VARCHAR(10) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    -- The owner token of the execution that holds, or held, the entry
    -- (done: the one that completed it); empty when issued.
    owner       VARBINARY(255) NOT NULL,
    -- The fingerprint of the request that created the entry; empty when
    -- issued.
    fingerprint VARBINARY(255) NOT NULL,
    -- issued: the end of the issue's TTL; processing: the end of the lease;
    -- committed and done: the end of the TTL. A row whose time has come is
    -- treated as absent, whether or not the janitor has deleted it yet.
    expires     BIGINT NOT NULL,
    -- committed: the end of the lease of the execution that committed;
    -- NULL otherwise.
    held_until  BIGINT NULL,
    -- done: the encoded response; NULL otherwise. One record must fit the
    -- server's max_allowed_packet (with about 1 KiB to spare).
    record      LONGBLOB NULL,
    -- issued, and processing when taken from an issue: the issue's TTL in
    -- milliseconds; NULL otherwise.
    issue_ttl   BIGINT NULL,
    -- When the entry entered its state (issued, acquired, done).
    since       BIGINT NOT NULL,
    -- Counts the row's writes, so that every UPDATE of the store changes
    -- the row (MySQL reports rows changed, not rows matched).
    rev         BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (`key`),
    -- The janitor deletes expired rows in batches, oldest first.
    KEY idem_keys_expires_idx (expires),
    -- Store.List pages through the entries of one state, oldest first.
    KEY idem_keys_state_since_idx (state, since, `key`),
    CONSTRAINT idem_keys_state_check CHECK (state IN ('issued', 'processing', 'committed', 'done')),
    CONSTRAINT idem_keys_record_check CHECK ((state = 'done') = (record IS NOT NULL)),
    CONSTRAINT idem_keys_issue_check CHECK (state IN ('issued', 'processing') OR issue_ttl IS NULL),
    CONSTRAINT idem_keys_issued_check CHECK (state <> 'issued' OR issue_ttl IS NOT NULL)
) ENGINE = InnoDB
