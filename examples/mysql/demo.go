package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/idemkit/idem/examples/democlient"
)

// duplicates is how many identical requests the demo sends at once.
const duplicates = 8

// demo is -demo's client against base: package democlient's script (an
// order, its retry, the key with another body, a double click), a burst of
// identical requests, and then the orders of each key in the table orders:
// one each, or an error.
func demo(out io.Writer, base string, db *sql.DB, orders string) error {
	run := democlient.RunID()
	keys := []string{"order-1-" + run, "order-2-" + run, "order-3-" + run} // Play's two, the burst's
	errs := []error{
		democlient.Play(out, base, run),
		democlient.Burst(out, base, keys[2], `{"item":"lamp","amount":40}`, duplicates),
	}
	fmt.Fprintf(out, "\n# the orders table: one order per key, however many requests carried it\n"+
		"$ mysql -e \"SELECT idempotency_key, count(*) FROM %s WHERE idempotency_key IN ('%s') GROUP BY 1 ORDER BY 1\"\n",
		orders, strings.Join(keys, "', '"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, key := range keys {
		var n int
		err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+quote(orders)+" WHERE idempotency_key = ?", key).Scan(&n)
		fmt.Fprintf(out, "%s | %d\n", key, n)
		if err == nil && n != 1 {
			err = fmt.Errorf("key %s has %d orders, want 1", key, n)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
