module github.com/idemkit/idem/storage/rueidisstore

go 1.26.0

require (
	github.com/alicebob/miniredis/v2 v2.40.0
	github.com/idemkit/idem v0.1.0
	github.com/redis/rueidis v1.0.79
)

require (
	github.com/yuin/gopher-lua v1.1.1 // indirect
	golang.org/x/sys v0.47.0 // indirect
)
