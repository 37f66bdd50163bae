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
		var opts []memstore.Option
		if c.Memory.MaxEntries > 0 {
			opts = append(opts, memstore.WithMaxEntries(c.Memory.MaxEntries))
		}
		ms := memstore.New(opts...)
		return &openedStore{Store: ms, kind: "memory", ping: func(context.Context) error { return nil }, close: func() { ms.Close() }}, nil
	case c.Redis != nil:
		return openRedis(ctx, c.Redis, log)
	case c.Postgres != nil:
		return openPostgres(ctx, c.Postgres, log)
	}
	return nil, errors.New("no store declared")
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

// retry calls connect until it succeeds or ctx ends (the gateway is
// stopped), logging its failures: a gateway may start before its store.
func retry(ctx context.Context, log *slog.Logger, what string, connect func() error) error {
	delay := 250 * time.Millisecond
	for {
		err := connect()
		if err == nil {
			return nil
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
		if err := retry(ctx, log, "postgres", func() error { return st.CreateTable(ctx) }); err != nil {
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
