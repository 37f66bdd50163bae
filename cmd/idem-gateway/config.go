package main

import "time"

// Config is the gateway's configuration file. Every field is documented
// by its doc tag, and its default, when it has one, by its default tag:
// `idem-gateway -reference` prints them as the table in docs/gateway.md,
// and a test keeps the two the same.
type Config struct {
	Instances int                  `yaml:"instances" default:"1" doc:"How many gateway processes share this file's store. The memory store keeps its records in one process, so it is refused when more than 1 is declared."`
	Listen    []Listener           `yaml:"listen" doc:"The listeners that serve the routes: at least one."`
	Admin     Admin                `yaml:"admin" doc:"The admin listener: /healthz, /readyz."`
	Shutdown  time.Duration        `yaml:"shutdown_grace" default:"30s" doc:"On SIGTERM or SIGINT: how long the gateway waits for the requests in flight and their records before it exits anyway."`
	Log       Log                  `yaml:"log" doc:"The log, JSON lines on standard error."`
	Store     Store                `yaml:"store" doc:"Where the records live: exactly one of memory, redis, postgres and dynamodb."`
	Upstreams map[string]*Upstream `yaml:"upstreams" doc:"The services behind the gateway, by name: at least one."`
	Routes    []*Route             `yaml:"routes" doc:"What the gateway serves, matched as net/http's ServeMux matches patterns (the most specific wins); a request that matches none gets 404: at least one, at most 10000."`
}

// Listener is an address the gateway serves its routes on.
type Listener struct {
	Address           string        `yaml:"address" doc:"host:port to listen on (\":8080\", \"127.0.0.1:8443\"); required."`
	TLS               *ServerTLS    `yaml:"tls" doc:"Serve HTTPS with this certificate, in HTTP/2 or HTTP/1.1 as the client chooses (ALPN h2 or http/1.1); without it, plain HTTP/1.1."`
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout" default:"10s" doc:"How long a client may take to send a request's headers."`
	IdleTimeout       time.Duration `yaml:"idle_timeout" default:"2m" doc:"How long a keep-alive connection may wait for its next request."`
}

// ServerTLS is a listener's certificate.
type ServerTLS struct {
	Cert string `yaml:"cert" doc:"PEM certificate chain file; required with tls."`
	Key  string `yaml:"key" doc:"PEM private key file; required with tls."`
}

// Admin is the operator's listener.
type Admin struct {
	Address string `yaml:"address" doc:"host:port of the admin listener (/healthz: the process runs; /readyz: the configuration is loaded and the store answers; /metrics: Prometheus). Keep it off the public network. Empty: no admin listener."`
}

// Log is the log's settings.
type Log struct {
	Level string `yaml:"level" default:"info" doc:"debug, info, warn or error. The log never holds a key, a scope or a body."`
}

// Store is where the records live: exactly one of its fields.
type Store struct {
	Memory   *MemoryStore   `yaml:"memory" doc:"This process's memory: for one instance; records are lost when it stops."`
	Redis    *RedisStore    `yaml:"redis" doc:"Redis (or Valkey): a single server, a Cluster or a Sentinel group."`
	Postgres *PostgresStore `yaml:"postgres" doc:"A PostgreSQL table (pgstore)."`
	DynamoDB *DynamoDBStore `yaml:"dynamodb" doc:"An Amazon DynamoDB table (dynamostore), for gateways on AWS. The AWS SDK's default configuration gives the credentials and, unless region says, the region: AWS_REGION, AWS_ACCESS_KEY_ID, AWS_PROFILE and ~/.aws, a web identity (EKS), the task's role (ECS), the instance's role (EC2). The gateway needs dynamodb:GetItem, PutItem, UpdateItem, DeleteItem and DescribeTable on the table (and CreateTable, DescribeTimeToLive and UpdateTimeToLive with create_table)."`
}

// MemoryStore is the memory store's settings.
type MemoryStore struct {
	MaxEntries int `yaml:"max_entries" default:"100000" doc:"The most records kept at once, in flight and done; 0: the default (the memory store is always bounded). A record is never evicted before its ttl ends: when the store is full, new keys get 503 with Retry-After until records expire, and the stored responses are still replayed."`
}

// RedisStore is the Redis store's settings.
type RedisStore struct {
	Client         string        `yaml:"client" default:"rueidis" doc:"The client library: rueidis (pipelining, the faster) or go-redis."`
	Addrs          []string      `yaml:"addrs" doc:"host:port of the server; of some Cluster nodes with cluster; of the Sentinels with sentinel_master. Required."`
	Cluster        bool          `yaml:"cluster" doc:"The addresses are nodes of a Redis Cluster."`
	SentinelMaster string        `yaml:"sentinel_master" doc:"The addresses are Sentinels, and this is the name of the master they watch."`
	Username       string        `yaml:"username" doc:"ACL user name."`
	PasswordFile   string        `yaml:"password_file" doc:"File holding the password (trailing newline ignored). Never write the password in this file."`
	PasswordEnv    string        `yaml:"password_env" doc:"Environment variable holding the password; exclusive with password_file."`
	DB             int           `yaml:"db" default:"0" doc:"Database number (not with cluster)."`
	TLS            *ClientTLS    `yaml:"tls" doc:"Connect with TLS."`
	Prefix         string        `yaml:"prefix" default:"idem:" doc:"Prefix of the record keys."`
	Timeout        time.Duration `yaml:"timeout" default:"250ms" doc:"Bound of each store call, whole (dial, write and read included): a store that stops answering gets requests 503 with Retry-After after about this long, not a hang."`
}

// ClientTLS is how the gateway verifies a server it connects to.
type ClientTLS struct {
	CAFile     string `yaml:"ca_file" doc:"PEM file of the CAs to trust; empty: the system's."`
	ServerName string `yaml:"server_name" doc:"Name to verify the server's certificate against; empty: the address's host."`
}

// PostgresStore is the PostgreSQL store's settings.
type PostgresStore struct {
	DSN         string        `yaml:"dsn" doc:"Connection string without a password (postgres://user@host/db, or key=value); with a password use dsn_file or dsn_env. Exactly one of the three."`
	DSNFile     string        `yaml:"dsn_file" doc:"File holding the connection string."`
	DSNEnv      string        `yaml:"dsn_env" doc:"Environment variable holding the connection string."`
	Table       string        `yaml:"table" default:"idem_keys" doc:"The table (optionally schema-qualified); created at start when missing."`
	CreateTable bool          `yaml:"create_table" default:"true" doc:"Create the table at start when it is missing; false for those who migrate with their own tools (pgstore.Schema prints the SQL)."`
	MaxConns    int           `yaml:"max_conns" default:"0" doc:"The pool's most connections; 0: pgx's default."`
	Timeout     time.Duration `yaml:"timeout" default:"1s" doc:"Bound of each store call, whole (waiting for a connection of the pool, dial and query included): a store that stops answering gets requests 503 with Retry-After after about this long, not a hang. Each try of creating the table at start has this bound or 10s, the longer."`
}

// DynamoDBStore is the DynamoDB store's settings.
type DynamoDBStore struct {
	Table       string        `yaml:"table" doc:"The table, or its ARN; required. Its partition key is id, a string, with no sort key, and DynamoDB's TTL on the attribute ttl (dynamostore's documentation has its CloudFormation and Terraform). Checked at start (DescribeTable): a table that is missing (without create_table), or keyed otherwise, stops the gateway."`
	Region      string        `yaml:"region" doc:"The table's AWS region (eu-west-1); empty: the AWS SDK's (AWS_REGION, the profile's), or us-east-1 with an endpoint."`
	Endpoint    string        `yaml:"endpoint" doc:"URL of a DynamoDB API of its own: DynamoDB Local, dynalite, LocalStack (http://localhost:8000); empty: AWS's, for the region. With an endpoint that is not AWS's (a host under amazonaws.com) and no credentials in the environment (AWS_ACCESS_KEY_ID, AWS_PROFILE, ...), the requests are signed with dummy ones."`
	CreateTable bool          `yaml:"create_table" default:"false" doc:"Create the table at start when it is missing (on-demand capacity, TTL on ttl), and wait until it is active: for tests and quick starts. In production the table belongs to the infrastructure's code."`
	Timeout     time.Duration `yaml:"timeout" default:"1s" doc:"Bound of each store call, whole (dial, TLS, and the AWS SDK's retries of a throttled or failed request included): a store that stops answering gets requests 503 with Retry-After after about this long, not a hang. Each try of checking (or creating) the table at start has this bound or 10s, the longer (or 3m to create)."`
}

// Upstream is a service behind the gateway.
type Upstream struct {
	URL                   string        `yaml:"url" doc:"Base URL: http://host:port (or https://); a path is prefixed to every request's. Required."`
	H2C                   bool          `yaml:"h2c" doc:"Speak HTTP/2 without TLS (prior knowledge) to an http:// upstream."`
	Timeout               time.Duration `yaml:"timeout" default:"60s" doc:"Bound of a whole upstream call, from the request sent to the response's last byte; 0: none. A protected request's call goes on when its client leaves (its retry gets the stored response), until this bound: past it the client gets 502 and retries get 409, never a second call."`
	DialTimeout           time.Duration `yaml:"dial_timeout" default:"5s" doc:"Bound of a connection's dial."`
	ResponseHeaderTimeout time.Duration `yaml:"response_header_timeout" default:"0s" doc:"How long the upstream may take to answer's headers; 0: no bound (the request's context, and the lease renewed meanwhile). Past it the client gets 502 and the key stays done: retries get 409, never a second call."`
	IdleConnTimeout       time.Duration `yaml:"idle_conn_timeout" default:"90s" doc:"How long an idle connection to the upstream is kept."`
	MaxConns              int           `yaml:"max_conns" default:"0" doc:"The most connections to the upstream (dialing, active and idle); 0: no bound."`
	MaxIdleConns          int           `yaml:"max_idle_conns" default:"100" doc:"The most idle connections kept to the upstream."`
}

// Route is what the gateway does with the requests that match a pattern.
type Route struct {
	Match           string        `yaml:"match" doc:"A net/http ServeMux pattern: [METHOD ][HOST]/[PATH], as \"POST api.example.com/orders/{id}\" or \"/\"; required, unique. The pattern scopes the records: changing it starts new records."`
	Upstream        string        `yaml:"upstream" doc:"The name of the upstream that serves the route; required."`
	Protect         []string      `yaml:"protect" default:"[POST, PATCH]" doc:"The methods made idempotent; others pass through untouched. [] protects nothing: a plain proxy route (WebSocket, SSE, GET), which needs no scope."`
	Key             Key           `yaml:"key" doc:"Where a request's idempotency key is: exactly one of header, json and form; default the Idempotency-Key header."`
	RequireKey      bool          `yaml:"require_key" doc:"A protected request without a key gets 400 instead of passing through unprotected. Implied by json and form keys."`
	Scope           *Scope        `yaml:"scope" doc:"Whose records a request reads and writes: exactly one of header, authorization and none; required when the route protects a method."`
	Lease           time.Duration `yaml:"lease" default:"30s" doc:"How long a request in flight holds its key without being renewed; renewed while the upstream works. A gateway that dies frees its keys after at most this long. At least 30ms."`
	TTL             time.Duration `yaml:"ttl" default:"24h" doc:"How long a response is kept for retries; at least the lease."`
	Wait            time.Duration `yaml:"wait" default:"0s" doc:"How long a duplicate waits for the first request's answer before it gets 409 with Retry-After; 0: 409 at once."`
	MaxRequestBody  int64         `yaml:"max_request_body" default:"1048576" doc:"The largest protected request body, in bytes (413 beyond)."`
	MaxResponseBody int           `yaml:"max_response_body" default:"1048576" doc:"The largest response kept for replay, in bytes; a larger one is passed on, and its retries get 409."`
	Cacheable       []string      `yaml:"cacheable" doc:"The statuses whose responses are kept, as codes and ranges (\"200-299\", \"409\"); others release the key for a retry. Default: every status below 500."`
	Fingerprint     *bool         `yaml:"fingerprint" doc:"A retry must be the same request (method, path, query, Content-Type, body) or it gets 422. Default true with a header key, false with json or form keys (a provider's redelivery may differ in a timestamp)."`
}

// Key says where the idempotency key is.
type Key struct {
	Header string `yaml:"header" doc:"A header holding the key, as the IETF draft's Idempotency-Key (an RFC 8941 string or token)."`
	JSON   string `yaml:"json" doc:"A dotted path of object members in a JSON body (\"id\", \"data.object.id\"), as a payment provider's callback carries its event id."`
	Form   string `yaml:"form" doc:"A form field of an application/x-www-form-urlencoded body (\"trade_no\"); several fields joined with commas."`
}

// Scope says whose records a request reads and writes. A request reads
// only the records of its own scope.
type Scope struct {
	Header        string    `yaml:"header" doc:"A header that the authentication proxy in front sets to the principal (X-Auth-Subject); requests without it get 401. The proxy in front must overwrite it: a client that can set it can read another's records."`
	Authorization bool      `yaml:"authorization" doc:"The Authorization header, whole: for credentials that never change between retries (static API keys, Basic)."`
	None          bool      `yaml:"none" doc:"Every request shares one scope: for routes without principals (a provider's callbacks keyed by its event ids)."`
	JWT           *JWTScope `yaml:"jwt" doc:"The principal is a claim of a JSON Web Token (Authorization: Bearer) that the gateway verifies: with an HMAC secret, or the public keys of a JWKS (a file or a URL). A protected request without a valid token gets 401. A client whose token is refreshed between two attempts stays in its scope."`
}

// JWTScope is how the gateway verifies a bearer token and which of its
// claims names the principal.
type JWTScope struct {
	Claim          string        `yaml:"claim" default:"sub" doc:"The claim that names the principal: a non-empty string."`
	HMACSecretFile string        `yaml:"hmac_secret_file" doc:"File holding the shared secret of HS256, HS384 and HS512 tokens (trailing newline ignored): at least 32 bytes, and 48 for HS384, 64 for HS512 (RFC 7518)."`
	HMACSecretEnv  string        `yaml:"hmac_secret_env" doc:"Environment variable holding the shared secret; exclusive with hmac_secret_file."`
	JWKSFile       string        `yaml:"jwks_file" doc:"File holding a JSON Web Key Set (RSA of 2048 bits or more, EC P-256/P-384/P-521, Ed25519 public keys), read at start and at each reload."`
	JWKSURL        string        `yaml:"jwks_url" doc:"URL of a JSON Web Key Set (https, or http on a loopback address), fetched at start and every jwks_refresh, and when a token names an unknown kid (at most once a minute)."`
	JWKSRefresh    time.Duration `yaml:"jwks_refresh" default:"5m" doc:"How often jwks_url is fetched again."`
	Issuer         string        `yaml:"issuer" doc:"The iss a token must carry; empty: not checked."`
	Audience       string        `yaml:"audience" doc:"A value the token's aud must hold; empty: not checked."`
	Algorithms     []string      `yaml:"algorithms" doc:"The alg values accepted (HS256, RS256, PS256, ES256, EdDSA, ...); default every one the keys allow. none is never accepted."`
	Leeway         time.Duration `yaml:"leeway" default:"30s" doc:"Clock skew allowed on exp, nbf and iat."`
}
