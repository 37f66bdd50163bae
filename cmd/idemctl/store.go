package main

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/storage/pgstore"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/idemkit/idem/storage/sqlstore"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// quiet drops go-redis's own log lines (a failed dial, say): the error
// they tell of reaches idemctl's message.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// Print drops go-sql-driver/mysql's own log lines likewise.
func (quiet) Print(...any) {}

func init() {
	redis.SetLogger(quiet{})
	mysql.SetLogger(quiet{})
}

// open opens the store that the global flags name as c.store, and returns
// what closes it. It sends nothing to the store, but to DynamoDB, whose
// table it checks (see openDynamoDB), within ctx.
func (c *cli) open(ctx context.Context) (closeStore func(), err error) {
	if err := c.chooseStore(c.given); err != nil {
		return nil, err
	}
	switch {
	case c.dynamodb != "":
		return c.openDynamoDB(ctx)
	case c.pg != "":
		return c.openPG()
	case c.mysql != "":
		return c.openMySQL()
	}
	var rdb redis.UniversalClient
	switch {
	case c.redis != "":
		rdb = redis.NewClient(clientOptions(c.redis))
	case c.redisURL != "":
		c.secrets = append(c.secrets, c.redisURL)
		opt, err := redis.ParseURL(c.redisURL)
		if err != nil {
			// Its error may quote the URL, password and all.
			return nil, usageError("-redis-url is not a URL that go-redis accepts (redis://user:password@host:port/db, rediss://, unix://)")
		}
		c.secrets = append(c.secrets, opt.Password)
		withClientOptions(opt)
		rdb = redis.NewClient(opt)
	default:
		var addrs []string
		for a := range strings.SplitSeq(c.redisCluster, ",") {
			if a = strings.TrimSpace(a); a != "" {
				addrs = append(addrs, a)
			}
		}
		o := clientOptions("")
		rdb = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                 addrs,
			ContextTimeoutEnabled: o.ContextTimeoutEnabled,
			DialTimeout:           o.DialTimeout,
			ReadTimeout:           o.ReadTimeout,
			WriteTimeout:          o.WriteTimeout,
			MaxRetries:            o.MaxRetries,
			DialerRetries:         o.DialerRetries,
		})
	}
	c.store = redisstore.New(rdb, redisstore.WithPrefix(c.prefix))
	return func() { rdb.Close() }, nil
}

// clientOptions returns redisstore.ClientOptions for addr with the
// timeouts of an operator's tool, which may run far from Redis, rather
// than of a request path: a page of a listing is a pipeline of up to a
// thousand look-ups, and -timeout bounds the whole.
func clientOptions(addr string) *redis.Options {
	o := redisstore.ClientOptions(addr)
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 5*time.Second, 5*time.Second, 5*time.Second
	return o
}

// withClientOptions sets in opt, parsed from a URL, the options of
// clientOptions that the URL left at go-redis's defaults.
func withClientOptions(opt *redis.Options) {
	o := clientOptions(opt.Addr)
	opt.ContextTimeoutEnabled = true
	if opt.DialTimeout == 0 {
		opt.DialTimeout = o.DialTimeout
	}
	if opt.ReadTimeout == 0 {
		opt.ReadTimeout = o.ReadTimeout
	}
	if opt.WriteTimeout == 0 {
		opt.WriteTimeout = o.WriteTimeout
	}
	if opt.MaxRetries == 0 {
		opt.MaxRetries = o.MaxRetries
	}
	if opt.DialerRetries == 0 {
		opt.DialerRetries = o.DialerRetries
	}
}

// openPG opens the PostgreSQL store.
func (c *cli) openPG() (closeStore func(), err error) {
	c.secrets = append(c.secrets, c.pg)
	cfg, err := pgxpool.ParseConfig(c.pg)
	if err != nil {
		// Its error quotes the DSN, with the password masked on a best
		// effort basis.
		return nil, usageError("-pg is not a connection string that pgx accepts (postgres://user:password@host:port/db, or key=value ...)")
	}
	c.secrets = append(c.secrets, cfg.ConnConfig.Password)
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	store, err := pgstore.New(pool, pgstore.WithTable(c.table))
	if err != nil {
		pool.Close()
		if errors.Is(err, pgstore.ErrTableName) {
			return nil, usageError("-table: %v", err)
		}
		return nil, err
	}
	c.store = store
	return func() {
		store.Close()
		pool.Close()
	}, nil
}

// openMySQL opens the MySQL (or MariaDB) store.
func (c *cli) openMySQL() (closeStore func(), err error) {
	c.secrets = append(c.secrets, c.mysql)
	cfg, err := mysql.ParseDSN(c.mysql)
	if err != nil {
		return nil, usageError("-mysql is not a DSN that go-sql-driver/mysql accepts (user:password@tcp(host:3306)/dbname)")
	}
	c.secrets = append(c.secrets, cfg.Passwd)
	if cfg.DBName == "" {
		return nil, usageError("-mysql names no database: user:password@tcp(host:3306)/dbname")
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second // the dial's; -timeout bounds the whole
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(2)
	store, err := sqlstore.New(db, sqlstore.MySQL, sqlstore.WithTable(c.table))
	if err != nil {
		db.Close()
		if errors.Is(err, sqlstore.ErrTableName) {
			return nil, usageError("-table: %v", err)
		}
		return nil, err
	}
	c.store = store
	return func() {
		store.Close()
		db.Close()
	}, nil
}
