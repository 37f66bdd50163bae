package main

import (
	"bytes"
	"regexp"
	"testing"

	"github.com/idemkit/idem/internal/redistest"
)

// TestDemo runs the demo on miniredis, and on a real redis-server (twice,
// as runs follow one another on one Redis), and checks its ledger: each
// payment credited once, alice's crashed entry replayed by another
// consumer.
func TestDemo(t *testing.T) {
	t.Run("miniredis", func(t *testing.T) { checkDemo(t, "") })
	t.Run("redis", func(t *testing.T) {
		addr := redistest.Addr(t)
		checkDemo(t, addr)
		checkDemo(t, addr)
	})
}

func checkDemo(t *testing.T, addr string) {
	t.Helper()
	var out bytes.Buffer
	if err := runDemo(addr, &out); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	s := out.String()
	t.Log("\n" + s)
	rows := regexp.MustCompile(`(?m)^  (pay-\S+) +acct-\d +\S+ +(\d) +(\S+)  (\S+)$`).FindAllStringSubmatch(s, -1)
	if len(rows) != demoPayments {
		t.Fatalf("%d ledger rows, want %d", len(rows), demoPayments)
	}
	dups := 0
	for _, r := range rows {
		if r[3] != "1" {
			t.Errorf("%s credited %s times, want 1", r[1], r[3])
		}
		if r[2] == "2" {
			dups++
		}
	}
	if dups != 2 {
		t.Errorf("%d payments sent twice, want 2", dups)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`every payment credited exactly once; all 10 entries acked, none pending`),
		// alice's last credit: not acked, as she crashed at its XACK...
		regexp.MustCompile(`consumer=alice entry=\S+ payment=\S+ via=read outcome=applied by=alice balance=\d+ acked=false err=`),
		// ...then claimed by bob or carol, and replayed:
		regexp.MustCompile(`consumer=(bob|carol) entry=\S+ payment=\S+ via=claim outcome=replayed by=alice balance=\d+ acked=true`),
		regexp.MustCompile(`XPENDING: 3 entries pending with her`),
	} {
		if !want.MatchString(s) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
}
