package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
	"github.com/idemkit/idem/storage/pgstore"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/idemkit/idem/storage/rueidisstore"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// openedStore is the store of a configuration and what the gateway needs
// of its client: a readiness probe and a close.
type openedStore struct {
	storage.Store
	kind  string
	ping  func(ctx context.Context) error
	close func()
}

// openStore connects to the store c declares. A store that does not
// answer yet is tried again until it does or ctx ends: meanwhile the
// admin listener answers /healthz, and /readyz 503.
func openStore(ctx context.Context, c *Store, log *slog.Logger) (*openedStore, error) {
	switch {
	case c.Memory != nil:
		// Never an eviction: a done record evicted would let its retry
		// call the upstream again. A full store refuses new keys
		// (storage.ErrFull: 503 with Retry-After); max_entries 0 keeps
		// memstore's default bound.
		ms := memstore.New(memstore.WithMaxEntries(c.Memory.MaxEntries), memstore.WithoutEviction())
		return &openedStore{Store: ms, kind: "memory", ping: func(context.Context) error { return nil }, close: func() { ms.Close() }}, nil
	case c.Redis != nil:
		s, err := openRedis(ctx, c.Redis, log)
		if err != nil {
			return nil, err
		}
		s.Store = withTimeout(s.Store, c.Redis.Timeout)
		return s, nil
	case c.Postgres != nil:
		if c.Postgres.Timeout <= 0 {
			return nil, fmt.Errorf("store.postgres.timeout: %v: must be positive", c.Postgres.Timeout)
		}
		s, err := openPostgres(ctx, c.Postgres, log)
		if err != nil {
			return nil, err
		}
		s.Store = withTimeout(s.Store, c.Postgres.Timeout)
		return s, nil
	case c.DynamoDB != nil:
		if c.DynamoDB.Timeout <= 0 {
			return nil, fmt.Errorf("store.dynamodb.timeout: %v: must be positive", c.DynamoDB.Timeout)
		}
		s, err := openDynamoDB(ctx, c.DynamoDB, log)
		if err != nil {
			return nil, err
		}
		s.Store = withTimeout(s.Store, c.DynamoDB.Timeout)
		return s, nil
	}
	return nil, errors.New("no store declared")
}

// withTimeout returns s with each call bounded by d: a call that has no
// answer within d fails (with an error wrapping the context's
// DeadlineExceeded), so a store that stops answering (a frozen server, a
// lost network) gets requests 503 with Retry-After, ErrStoreUnavailable,
// after about d rather than a hang. The caller's context still ends a
// call sooner. The wrapper has the optional interfaces of s
// (storage.Issuer, storage.Inspector), and only those; d <= 0 returns s.
func withTimeout(s storage.Store, d time.Duration) storage.Store {
	if d <= 0 {
		return s
	}
	t := &timeoutStore{s: s, d: d}
	iss, isIssuer := s.(storage.Issuer)
	ins, isInspector := s.(storage.Inspector)
	switch {
	case isIssuer && isInspector:
		return struct {
			*timeoutStore
			timeoutIssuer
			timeoutInspector
		}{t, timeoutIssuer{t, iss}, timeoutInspector{t, ins}}
	case isIssuer:
		return struct {
			*timeoutStore
			timeoutIssuer
		}{t, timeoutIssuer{t, iss}}
	case isInspector:
		return struct {
			*timeoutStore
			timeoutInspector
		}{t, timeoutInspector{t, ins}}
	}
	return t
}

// timeoutStore bounds each call of s by d (see withTimeout).
type timeoutStore struct {
	s storage.Store
	d time.Duration
}

// bound returns the context of one call, under ctx.
func (t *timeoutStore) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, t.d)
}

// explain says, of a call's error, when the bound ended the call rather
// than the caller's ctx.
func (t *timeoutStore) explain(ctx, call context.Context, err error) error {
	if err != nil && call.Err() != nil && ctx.Err() == nil {
		return fmt.Errorf("%w (no answer within the store's timeout, %v)", err, t.d)
	}
	return err
}

func (t *timeoutStore) Acquire(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (storage.Result, error) {
	call, cancel := t.bound(ctx)
	defer cancel()
	res, err := t.s.Acquire(call, key, owner, fingerprint, lease)
	return res, t.explain(ctx, call, err)
}

func (t *timeoutStore) Complete(ctx context.Context, key, owner string, record []byte, ttl time.Duration) error {
	call, cancel := t.bound(ctx)
	defer cancel()
	return t.explain(ctx, call, t.s.Complete(call, key, owner, record, ttl))
}

func (t *timeoutStore) Release(ctx context.Context, key, owner string) error {
	call, cancel := t.bound(ctx)
	defer cancel()
	return t.explain(ctx, call, t.s.Release(call, key, owner))
}

func (t *timeoutStore) Extend(ctx context.Context, key, owner string, lease time.Duration) error {
	call, cancel := t.bound(ctx)
	defer cancel()
	return t.explain(ctx, call, t.s.Extend(call, key, owner, lease))
}

// timeoutIssuer bounds the calls of a storage.Issuer.
type timeoutIssuer struct {
	t *timeoutStore
	s storage.Issuer
}

func (t timeoutIssuer) Issue(ctx context.Context, key string, ttl time.Duration) error {
	call, cancel := t.t.bound(ctx)
	defer cancel()
	return t.t.explain(ctx, call, t.s.Issue(call, key, ttl))
}

func (t timeoutIssuer) AcquireIssued(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (storage.Result, error) {
	call, cancel := t.t.bound(ctx)
	defer cancel()
	res, err := t.s.AcquireIssued(call, key, owner, fingerprint, lease)
	return res, t.t.explain(ctx, call, err)
}

// timeoutInspector bounds the calls of a storage.Inspector.
type timeoutInspector struct {
	t *timeoutStore
	s storage.Inspector
}

func (t timeoutInspector) Lookup(ctx context.Context, key string, withRecord bool) (storage.Entry, error) {
	call, cancel := t.t.bound(ctx)
	defer cancel()
	e, err := t.s.Lookup(call, key, withRecord)
	return e, t.t.explain(ctx, call, err)
}

func (t timeoutInspector) List(ctx context.Context, q storage.Query) (storage.Page, error) {
	call, cancel := t.t.bound(ctx)
	defer cancel()
	p, err := t.s.List(call, q)
	return p, t.t.explain(ctx, call, err)
}

func (t timeoutInspector) Remove(ctx context.Context, key, version string) (storage.Entry, error) {
	call, cancel := t.t.bound(ctx)
	defer cancel()
	e, err := t.s.Remove(call, key, version)
	return e, t.t.explain(ctx, call, err)
}

// secret reads a secret from a file or an environment variable.
func secret(file, env string) (string, error) {
	switch {
	case file != "":
		return readSecretFile(file)
	case env != "":
		return os.Getenv(env), nil
	}
	return "", nil
}

func redisTLS(c *RedisStore) (*tls.Config, error) {
	if c.TLS == nil {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.TLS.ServerName}
	if c.TLS.CAFile != "" {
		pool, err := loadCAs(c.TLS.CAFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

func openRedis(ctx context.Context, c *RedisStore, log *slog.Logger) (*openedStore, error) {
	password, err := secret(c.PasswordFile, c.PasswordEnv)
	if err != nil {
		return nil, err
	}
	tlsConfig, err := redisTLS(c)
	if err != nil {
		return nil, err
	}
	if c.Client == "go-redis" {
		base := redisstore.ClientOptions(c.Addrs[0])
		rdb := redis.NewUniversalClient(&redis.UniversalOptions{
			Addrs:                 c.Addrs,
			IsClusterMode:         c.Cluster,
			MasterName:            c.SentinelMaster,
			Username:              c.Username,
			Password:              password,
			DB:                    c.DB,
			TLSConfig:             tlsConfig,
			ContextTimeoutEnabled: base.ContextTimeoutEnabled,
			DialTimeout:           c.Timeout,
			ReadTimeout:           c.Timeout,
			WriteTimeout:          c.Timeout,
			MaxRetries:            base.MaxRetries,
			DialerRetries:         base.DialerRetries,
		})
		return &openedStore{
			Store: redisstore.New(rdb, redisstore.WithPrefix(c.Prefix)),
			kind:  "redis (go-redis)",
			ping:  func(ctx context.Context) error { return rdb.Ping(ctx).Err() },
			close: func() { rdb.Close() },
		}, nil
	}
	opt := rueidisstore.ClientOption(c.Addrs...)
	opt.Dialer.Timeout, opt.ConnWriteTimeout = c.Timeout, c.Timeout
	opt.Username, opt.Password, opt.SelectDB, opt.TLSConfig = c.Username, password, c.DB, tlsConfig
	switch {
	case c.SentinelMaster != "":
		opt.Sentinel = rueidis.SentinelOption{MasterSet: c.SentinelMaster, Username: c.Username, Password: password, TLSConfig: tlsConfig}
	case !c.Cluster:
		opt.ForceSingleClient = true
	}
	// rueidis connects when it is created: retried until Redis answers.
	var client rueidis.Client
	err = retry(ctx, log, "redis", func() (err error) {
		client, err = rueidis.NewClient(opt)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &openedStore{
		Store: rueidisstore.New(client, rueidisstore.WithPrefix(c.Prefix)),
		kind:  "redis (rueidis)",
		ping:  func(ctx context.Context) error { return client.Do(ctx, client.B().Ping().Build()).Error() },
		close: client.Close,
	}, nil
}

// permanent is an error of connect that retry returns at once: trying
// again cannot help (a table that does not exist).
type permanent struct{ error }

func (p permanent) Unwrap() error { return p.error }

// retry calls connect until it succeeds, fails with a permanent error, or
// ctx ends (the gateway is stopped), logging its failures: a gateway may
// start before its store.
func retry(ctx context.Context, log *slog.Logger, what string, connect func() error) error {
	delay := 250 * time.Millisecond
	for {
		err := connect()
		if err == nil {
			return nil
		}
		if p := (permanent{}); errors.As(err, &p) {
			return p.error
		}
		log.Warn("store not reachable yet; retrying", "store", what, "err", err.Error(), "in", delay)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (stopped while connecting: %w)", what, err, context.Cause(ctx))
		case <-time.After(delay):
		}
		delay = min(2*delay, 2*time.Second)
	}
}

func openPostgres(ctx context.Context, c *PostgresStore, log *slog.Logger) (*openedStore, error) {
	dsn := c.DSN
	if c.DSN == "" {
		var err error
		if dsn, err = secret(c.DSNFile, c.DSNEnv); err != nil {
			return nil, err
		}
	}
	cfg, err := pgxpool.ParseConfig(strings.TrimSpace(dsn))
	if err != nil {
		// pgx's error may quote the DSN, password included.
		return nil, errors.New("postgres: the connection string does not parse")
	}
	if c.MaxConns > 0 {
		cfg.MaxConns = int32(c.MaxConns)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	st, err := pgstore.New(pool, pgstore.WithTable(c.Table))
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if c.CreateTable {
		// Each try is bounded too (DDL may wait for a lock: at least
		// 10s), so that a server that does not answer is logged and
		// tried again rather than waited for.
		create := func() error {
			ctx, cancel := context.WithTimeout(ctx, max(c.Timeout, 10*time.Second))
			defer cancel()
			return st.CreateTable(ctx)
		}
		if err := retry(ctx, log, "postgres", create); err != nil {
			st.Close()
			pool.Close()
			return nil, fmt.Errorf("creating table %s: %w", c.Table, err)
		}
	}
	return &openedStore{
		Store: st,
		kind:  "postgres",
		ping:  pool.Ping,
		close: func() { st.Close(); pool.Close() },
	}, nil
}
