module github.com/idemkit/idem/cmd/idem-gateway

go 1.26.0

replace github.com/idemkit/idem => ../..

replace github.com/idemkit/idem/storage/redisstore => ../../storage/redisstore

replace github.com/idemkit/idem/storage/rueidisstore => ../../storage/rueidisstore

replace github.com/idemkit/idem/storage/pgstore => ../../storage/pgstore

require (
	github.com/idemkit/idem v0.0.0-00010101000000-000000000000
	github.com/idemkit/idem/storage/pgstore v0.0.0-00010101000000-000000000000
	github.com/idemkit/idem/storage/redisstore v0.0.0-00010101000000-000000000000
	github.com/idemkit/idem/storage/rueidisstore v0.0.0-00010101000000-000000000000
	github.com/jackc/pgx/v5 v5.12.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/redis/rueidis v1.0.79
	go.yaml.in/yaml/v3 v3.0.6
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)
