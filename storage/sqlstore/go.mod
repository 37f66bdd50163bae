module github.com/idemkit/idem/storage/sqlstore

go 1.25.0

replace github.com/idemkit/idem => ../../

require (
	github.com/go-sql-driver/mysql v1.10.1
	github.com/idemkit/idem v0.0.0-00010101000000-000000000000
)

require filippo.io/edwards25519 v1.2.0 // indirect
