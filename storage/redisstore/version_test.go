package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/redis/go-redis/v9"
)

// versionHook answers INFO as a server of version would.
type versionHook struct{ version string }

func (versionHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (versionHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h versionHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if c, ok := cmd.(*redis.StringCmd); ok && cmd.Name() == "info" && err == nil {
			c.SetVal(strings.Replace(c.Val(), "redis_version:", "redis_version:"+h.version+"\r\nwas_version:", 1))
		}
		return err
	}
}

// TestRedisVersion: on a server that says it is older than 7.0, every
// operation that starts new work fails with ErrRedisVersion, naming the
// version, and writes nothing; on 7.0 and newer it works.
func TestRedisVersion(t *testing.T) {
	ctx := t.Context()
	for version, old := range map[string]bool{"6.2.14": true, "7.0.0": false, "7.2.4": false} {
		rdb := client(t, redistest.Addr(t))
		rdb.AddHook(versionHook{version})
		p := prefix("version")
		s := redisstore.New(rdb, redisstore.WithPrefix(p))
		_, errAcquire := s.Acquire(ctx, "k", "o", "fp", time.Minute)
		_, errIssued := s.AcquireIssued(ctx, "k", "o", "fp", time.Minute)
		errIssue := s.Issue(ctx, "i", time.Minute)
		for name, err := range map[string]error{"acquire": errAcquire, "acquire issued": errIssued, "issue": errIssue} {
			switch {
			case old && (!errors.Is(err, redisstore.ErrRedisVersion) || !strings.Contains(err.Error(), "need Redis 7.0 or newer (SET NX GET); the server is 6.2.14")):
				t.Errorf("%s on %s: %v, want ErrRedisVersion naming it", name, version, err)
			case !old && errors.Is(err, redisstore.ErrRedisVersion):
				t.Errorf("%s on %s: %v", name, version, err)
			}
		}
		if n, err := rdb.Exists(ctx, p+"k", p+"i").Result(); err != nil || (old && n != 0) {
			t.Errorf("keys after refused operations on %s: %d, %v", version, n, err)
		}
	}
}
