package rueidisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/storage/rueidisstore"
	"github.com/redis/rueidis"
)

// oldServer is a client whose INFO, to it or to one of its nodes, answers
// as a server of version would (an ECHO of such an answer).
type oldServer struct {
	rueidis.Client
	version string
}

func (c oldServer) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if args := cmd.Commands(); len(args) > 0 && args[0] == "INFO" {
		info := "# Server\r\nredis_version:" + c.version + "\r\n# Memory\r\nmaxmemory_policy:noeviction\r\n"
		return c.Client.Do(ctx, c.Client.B().Echo().Message(info).Build())
	}
	return c.Client.Do(ctx, cmd)
}

func (c oldServer) Nodes() map[string]rueidis.Client {
	out := map[string]rueidis.Client{}
	for addr, n := range c.Client.Nodes() {
		out[addr] = oldServer{Client: n, version: c.version}
	}
	return out
}

// TestRedisVersion: on a server that says it is older than 7.0, every
// operation that starts new work fails with ErrRedisVersion, naming the
// version, and writes nothing; on 7.0 and newer it works.
func TestRedisVersion(t *testing.T) {
	ctx := t.Context()
	c := client(t, redistest.Addr(t))
	for version, old := range map[string]bool{"6.2.14": true, "7.0.0": false, "7.2.4": false} {
		p := prefix("version")
		s := rueidisstore.New(oldServer{Client: c, version: version}, rueidisstore.WithPrefix(p))
		_, errAcquire := s.Acquire(ctx, "k", "o", "fp", time.Minute)
		_, errIssued := s.AcquireIssued(ctx, "k", "o", "fp", time.Minute)
		errIssue := s.Issue(ctx, "i", time.Minute)
		for name, err := range map[string]error{"acquire": errAcquire, "acquire issued": errIssued, "issue": errIssue} {
			switch {
			case old && (!errors.Is(err, rueidisstore.ErrRedisVersion) || !strings.Contains(err.Error(), "need Redis 7.0 or newer (SET NX GET); the server is 6.2.14")):
				t.Errorf("%s on %s: %v, want ErrRedisVersion naming it", name, version, err)
			case !old && errors.Is(err, rueidisstore.ErrRedisVersion):
				t.Errorf("%s on %s: %v", name, version, err)
			}
		}
		exists := do(t, c, "EXISTS", p+"k", p+"i")
		if n, _ := exists.AsInt64(); old && n != 0 {
			t.Errorf("keys after refused operations on %s: %d", version, n)
		}
	}
}
