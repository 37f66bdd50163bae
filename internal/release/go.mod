module github.com/idemkit/idem/internal/release

go 1.26.0

require (
	golang.org/x/exp v0.0.0-20261113113407-e3970619a1a4
	golang.org/x/mod v0.43.0
	golang.org/x/tools v0.52.1-0.20261106145633-d407941a339a
)

require golang.org/x/sync v0.24.0 // indirect
