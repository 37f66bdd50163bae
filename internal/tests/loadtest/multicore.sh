#!/usr/bin/env bash
# The many-core figures of docs/performance.md ("Fleet", issue 28), on a
# machine that has neither Go nor Redis. Here, from the project root, pack
# the binaries (the load tool and this machine's redis-server with its
# libraries, then the bench suite's test binary):
#
#   ../shared/tools/multicore-bundle.sh .devbench   # or copy a redis-server and build loadtest with CGO_ENABLED=0
#   mv .devbench/loadtest .devbench/loadtest-main
#   CGO_ENABLED=0 go test -c -ldflags='-s -w' -o .devbench/bench-main.test ./internal/tests/bench
#   cp internal/tests/loadtest/multicore.sh .devbench/
#
# (build a second pair as loadtest-NAME and bench-NAME.test from another
# revision to compare), copy .devbench there and run .devbench/multicore.sh:
# about 5 minutes at the defaults (DUR=3s a phase, BT=1s a benchmark, RUNS=2
# Redis runs). Every figure lands in $OUT (default /tmp/multicore).
set -u
D=$(cd "$(dirname "$0")" && pwd)
O=${OUT:-/tmp/multicore}; mkdir -p "$O"
DUR=${DUR:-3s}; BT=${BT:-1s}; RUNS=${RUNS:-2}
date -u; nproc; lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Socket|NUMA node\(s\)'
"$D/redis-server.sh" --port 6390 --save '' --appendonly no >"$O/redis.log" 2>&1 &
rpid=$!
for b in "$D"/bench-*.test; do
  v=${b#"$D/bench-"}; v=${v%.test}
  echo "=== BenchmarkParallel $v $(date -u +%T)"
  timeout 150 "$b" -test.run '^$' -test.bench '^BenchmarkParallel$' -test.cpu 1,2,4,8,16 \
    -test.benchtime "$BT" -test.benchmem -test.mutexprofile "$O/mutex-$v.out" >"$O/parallel-$v.txt" 2>&1
  grep -E '^Benchmark|FAIL|panic' "$O/parallel-$v.txt"
done
for l in "$D"/loadtest-*; do
  v=${l#"$D/loadtest-"}
  echo "=== loadtest memory $v $(date -u +%T)"
  timeout 100 "$l" -store memory -concurrency 64 -duration "$DUR" >"$O/load-memory-$v.txt" 2>&1
  cat "$O/load-memory-$v.txt"
done
for i in $(seq 1 "$RUNS"); do
  echo "=== loadtest redis, run $i $(date -u +%T)"
  timeout 170 "$D/loadtest-main" -store redis -redis 127.0.0.1:6390 -concurrency 64 -duration "$DUR" >"$O/load-redis-$i.txt" 2>&1
  grep -vE '^    redis:' "$O/load-redis-$i.txt"
done
kill "$rpid"; wait "$rpid" 2>/dev/null
echo "=== done $(date -u +%T)"
