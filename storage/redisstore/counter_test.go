package redisstore_test

import (
	"context"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// A copy of internal/tests/redisx's CommandCounter, which this module
// cannot import (that module requires this one).

// commandCounter is a go-redis hook that counts round trips: one per
// command, one per pipeline (or transaction). A script run through
// redis.Script that falls back from EVALSHA to EVAL counts two, as it
// costs two. The commands a client sends to set up a new connection (HELLO,
// CLIENT SETINFO) go through the hooks too, so warm the connection up
// before counting. Add it with AddHook; the zero value is ready to use and
// safe for concurrent use.
type commandCounter struct{ n atomic.Int64 }

var _ redis.Hook = (*commandCounter)(nil)

// Count returns the round trips since creation or the last Reset.
func (c *commandCounter) Count() int64 { return c.n.Load() }

// Reset sets the count to zero.
func (c *commandCounter) Reset() { c.n.Store(0) }

// DialHook implements redis.Hook; dialing is not counted.
func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook: one per command.
func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook: one per pipeline.
func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmds)
	}
}
