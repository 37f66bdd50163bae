package main

import (
	"bufio"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// Redis's own accounting of a phase (issue 28): the time the server spent
// in the commands (INFO commandstats) and its CPU (INFO cpu), per request.
// Command time does not depend on the machine the way req/s does: Redis is
// single-threaded and shared by a whole fleet, so its time per request is
// what caps the fleet.
//
// A script's time in INFO commandstats includes the commands it runs with
// redis.call, which INFO commandstats also counts under their own names (an
// EVAL of 20,000 SETs shows eval 44.7 ms and set 9.9 ms, 45.8 ms of CPU in
// all: Redis 7.0.15). Summing every command would count those twice, so the
// command time of a phase is that of the commands the clients sent (the top
// level): the load tool counts, by name, the commands its clients send
// (sentCounter), and when scripts ran in a phase, the calls of a name beyond
// those sent ran inside the scripts. Their time is listed, apart, at the
// average time of a call of that name.

// cmdStat is one line of INFO commandstats.
type cmdStat struct{ calls, usec int64 }

// parseCommandStats reads the answer of INFO commandstats: lines such as
//
//	cmdstat_evalsha:calls=12,usec=345,usec_per_call=28.75,rejected_calls=0,failed_calls=0
//
// by command name ("evalsha"; a subcommand as "client|setinfo").
func parseCommandStats(info string) (map[string]cmdStat, error) {
	stats := map[string]cmdStat{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		rest, ok := strings.CutPrefix(line, "cmdstat_")
		if !ok {
			continue
		}
		// The name may hold '|' but not ':'; the fields follow the
		// first ':'.
		name, fields, ok := strings.Cut(rest, ":")
		if !ok || name == "" {
			return nil, fmt.Errorf("INFO commandstats: bad line %q", line)
		}
		var s cmdStat
		var seen int
		for f := range strings.SplitSeq(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			var dst *int64
			switch k {
			case "calls":
				dst = &s.calls
			case "usec":
				dst = &s.usec
			default:
				continue
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("INFO commandstats: bad line %q: %w", line, err)
			}
			*dst = n
			seen++
		}
		if seen != 2 {
			return nil, fmt.Errorf("INFO commandstats: no calls or usec in %q", line)
		}
		stats[name] = s
	}
	return stats, sc.Err()
}

// parseCPU reads the answer of INFO cpu: the seconds of CPU of the main
// thread (used_cpu_sys_main_thread + used_cpu_user_main_thread, Redis 6.2 and
// newer), or of the whole server (used_cpu_sys + used_cpu_user) when the
// main thread's are not reported; mainThread says which.
func parseCPU(info string) (seconds float64, mainThread bool, err error) {
	fields := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok || !strings.HasPrefix(k, "used_cpu_") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, false, fmt.Errorf("INFO cpu: bad line %s:%s: %w", k, v, err)
		}
		fields[k] = f
	}
	if err := sc.Err(); err != nil {
		return 0, false, err
	}
	sys, okSys := fields["used_cpu_sys_main_thread"]
	user, okUser := fields["used_cpu_user_main_thread"]
	if okSys && okUser {
		return sys + user, true, nil
	}
	sys, okSys = fields["used_cpu_sys"]
	user, okUser = fields["used_cpu_user"]
	if !okSys || !okUser {
		return 0, false, fmt.Errorf("INFO cpu: no used_cpu_sys or used_cpu_user in %q", info)
	}
	return sys + user, false, nil
}

// scripts are the commands that run Lua: their time includes the commands
// the script runs.
var scripts = map[string]bool{"eval": true, "evalsha": true, "eval_ro": true, "evalsha_ro": true, "fcall": true, "fcall_ro": true}

// unhooked are commands a client sends by itself, when it opens a
// connection (HELLO, AUTH, SELECT) or to keep an idle one alive (PING),
// which the hooks do not see: counted as sent, never as run inside a
// script (idem's scripts run none of them). A subcommand (client|setinfo,
// script|load) is always counted as sent.
var unhooked = map[string]bool{"hello": true, "auth": true, "select": true, "ping": true}

// own are the commands the statistics themselves send.
var own = map[string]bool{"info": true, "config|resetstat": true}

// serverSnapshot is the server's counters at one moment and the commands
// the load tool's clients had sent by then.
type serverSnapshot struct {
	cmds map[string]cmdStat
	sent map[string]int64
	cpu  float64 // seconds
}

// cmdFigure is a command's share of a phase: calls and microseconds, those
// that the clients sent, or those that ran inside scripts.
type cmdFigure struct {
	name  string
	calls float64
	usec  float64
}

// phaseStats is Redis's accounting of one phase.
type phaseStats struct {
	top, inScripts []cmdFigure // by time, most first
	usec           float64     // of the top-level commands
	cpu            float64     // seconds
	mainThread     bool
}

// split divides the counters between before and after into the commands
// the clients sent and those run inside scripts (see above), and leaves out
// the statistics' own commands.
func split(before, after serverSnapshot) (top, inScripts []cmdFigure) {
	ranScripts := false
	for name, a := range after.cmds {
		if scripts[name] && a.calls > before.cmds[name].calls {
			ranScripts = true
		}
	}
	for name, a := range after.cmds {
		b := before.cmds[name]
		calls, usec := a.calls-b.calls, a.usec-b.usec
		if calls <= 0 || own[name] {
			continue
		}
		sent := calls
		if ranScripts && !scripts[name] && !unhooked[name] && !strings.Contains(name, "|") {
			sent = min(calls, after.sent[name]-before.sent[name])
		}
		perCall := float64(usec) / float64(calls)
		if sent > 0 {
			top = append(top, cmdFigure{name, float64(sent), perCall * float64(sent)})
		}
		if nested := calls - sent; nested > 0 {
			inScripts = append(inScripts, cmdFigure{name, float64(nested), perCall * float64(nested)})
		}
	}
	byTime := func(a, b cmdFigure) int {
		if a.usec != b.usec {
			if a.usec > b.usec {
				return -1
			}
			return 1
		}
		return strings.Compare(a.name, b.name)
	}
	slices.SortFunc(top, byTime)
	slices.SortFunc(inScripts, byTime)
	return top, inScripts
}

// redisStats reads a Redis server's accounting around each phase, on a
// connection of its own.
type redisStats struct {
	rdb        *redis.Client
	sent       *sentCounter
	reset      bool // CONFIG RESETSTAT before each phase
	mainThread bool
}

func newRedisStats(addr string, sent *sentCounter, reset bool) *redisStats {
	return &redisStats{rdb: redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1}), sent: sent, reset: reset}
}

func (s *redisStats) Close() error { return s.rdb.Close() }

// snapshot resets the server's statistics when s.reset says so, and reads
// them.
func (s *redisStats) snapshot(ctx context.Context, reset bool) (serverSnapshot, error) {
	if reset {
		if err := s.rdb.ConfigResetStat(ctx).Err(); err != nil {
			return serverSnapshot{}, fmt.Errorf("CONFIG RESETSTAT (run with -resetstat=false where CONFIG is refused): %w", err)
		}
	}
	// The counters the clients had sent are read before the server's,
	// so that a command under way is counted by the server, not only by
	// the client: at worst a command counts as run inside a script.
	snap := serverSnapshot{sent: s.sent.snapshot()}
	info, err := s.rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return serverSnapshot{}, fmt.Errorf("INFO commandstats: %w", err)
	}
	if snap.cmds, err = parseCommandStats(info); err != nil {
		return serverSnapshot{}, err
	}
	if info, err = s.rdb.Info(ctx, "cpu").Result(); err != nil {
		return serverSnapshot{}, fmt.Errorf("INFO cpu: %w", err)
	}
	if snap.cpu, s.mainThread, err = parseCPU(info); err != nil {
		return serverSnapshot{}, err
	}
	return snap, nil
}

// begin starts a phase's accounting.
func (s *redisStats) begin(ctx context.Context) (serverSnapshot, error) {
	return s.snapshot(ctx, s.reset)
}

// end returns the accounting of the phase begun with before.
func (s *redisStats) end(ctx context.Context, before serverSnapshot) (phaseStats, error) {
	after, err := s.snapshot(ctx, false)
	if err != nil {
		return phaseStats{}, err
	}
	p := phaseStats{cpu: after.cpu - before.cpu, mainThread: s.mainThread}
	p.top, p.inScripts = split(before, after)
	for _, c := range p.top {
		p.usec += c.usec
	}
	return p, nil
}

// cpuPerRequest is the server's CPU per request in microseconds.
func (p phaseStats) cpuPerRequest(n int) float64 { return p.cpu * 1e6 / float64(n) }

// usecPerRequest is the command time per request in microseconds.
func (p phaseStats) usecPerRequest(n int) float64 { return p.usec / float64(n) }

// format writes the phase's figures for n requests: command time and CPU
// per request, then each command's calls per request and time per call.
func (p phaseStats) format(n int) string {
	var b strings.Builder
	thread := "the server's"
	if p.mainThread {
		thread = "main thread"
	}
	fmt.Fprintf(&b, "redis: commands %.2f us/req, CPU %.2f us/req (%s):", p.usecPerRequest(n), p.cpuPerRequest(n), thread)
	list := func(cs []cmdFigure) {
		for i, c := range cs {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, " %s %.2f/req %.1fus", c.name, c.calls/float64(n), c.usec/c.calls)
		}
	}
	list(p.top)
	if len(p.inScripts) > 0 {
		b.WriteString("; inside the scripts, not added:")
		list(p.inScripts)
	}
	return b.String()
}

// sentCounter counts, by name in lower case, the commands the load tool's
// Redis clients send: a go-redis hook (AddHook) and a rueidis client
// (countRueidis). It does not see the commands a client sends when it opens
// a connection (HELLO, CLIENT SETINFO).
type sentCounter struct{ m sync.Map } // name -> *atomic.Int64

func (c *sentCounter) add(name string, n int64) {
	v, ok := c.m.Load(name)
	if !ok {
		v, _ = c.m.LoadOrStore(strings.ToLower(name), new(atomic.Int64))
		if name != strings.ToLower(name) {
			c.m.LoadOrStore(name, v) // the same counter under the name as sent
		}
	}
	v.(*atomic.Int64).Add(n)
}

func (c *sentCounter) snapshot() map[string]int64 {
	m := map[string]int64{}
	c.m.Range(func(k, v any) bool {
		if name := k.(string); name == strings.ToLower(name) {
			m[name] = v.(*atomic.Int64).Load()
		}
		return true
	})
	return m
}

var _ redis.Hook = (*sentCounter)(nil)

// DialHook implements redis.Hook.
func (c *sentCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (c *sentCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.add(cmd.Name(), 1)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (c *sentCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.add(cmd.Name(), 1)
		}
		return next(ctx, cmds)
	}
}

// countedRueidis is a rueidis client whose commands sent through Do and
// DoMulti are counted (the stores and the naive floors use only those).
type countedRueidis struct {
	rueidis.Client
	sent *sentCounter
}

func countRueidis(c rueidis.Client, sent *sentCounter) rueidis.Client {
	return countedRueidis{c, sent}
}

func (c countedRueidis) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	c.count(&cmd)
	return c.Client.Do(ctx, cmd)
}

func (c countedRueidis) DoMulti(ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	for i := range multi {
		c.count(&multi[i])
	}
	return c.Client.DoMulti(ctx, multi...)
}

func (c countedRueidis) count(cmd *rueidis.Completed) {
	if args := cmd.Commands(); len(args) > 0 {
		c.sent.add(args[0], 1)
	}
}

// The targets of issue 28: Redis command time per request, idem over the
// naive floor of plain commands.
const (
	targetFirst  = 2.5 // first execution over SET NX PX + SET PX
	targetReplay = 2.0 // replay over GET
)

// printCommandTimeRatios prints each Redis store's command time per
// request over the naive floor of its client (redisstore: go-redis,
// rueidisstore: rueidis), against the targets of issue 28, and the same
// ratio of the server's CPU: through HTTP over the naive floor through
// HTTP, and the store's own calls over the naive commands without HTTP.
//
// INFO commandstats measures a command's time by the clock, not by the
// CPU: when the cores are busier than Redis's share (2 cores shared by the
// HTTP server, the load tool and Redis), the scheduler preempts Redis in
// the middle of commands, and their time grows with what else runs. Each
// ratio is therefore taken between phases that load the machine alike.
func printCommandTimeRatios(title string, results map[string]result, stores []namedStore) {
	fmt.Printf("\nRedis command time per request, idem over the naive floor, %s (issue 28: first <= %.1fx, replay <= %.1fx):\n", title, targetFirst, targetReplay)
	clients := map[string]string{"redisstore": "go-redis", "rueidisstore": "rueidis"}
	for _, st := range stores {
		client, ok := clients[st.name]
		if !ok {
			continue
		}
		for _, c := range []struct {
			name, floor string
			target      float64
		}{
			{st.name + "-first", client + "-first", targetFirst},
			{st.name + "-floor-first", client + "-calls-first", targetFirst},
			{st.name + "-replay", client + "-replay", targetReplay},
			{st.name + "-floor-replay", client + "-calls-replay", targetReplay},
		} {
			r, f := results[c.name], results[c.floor]
			if r.redis == nil || f.redis == nil { // not measured in this run
				continue
			}
			idem, floor := r.redis.usecPerRequest(r.n), f.redis.usecPerRequest(f.n)
			got := idem / floor
			verdict := "met"
			if got > c.target {
				verdict = "not met"
			}
			fmt.Printf("  %-26s %6.2f us over %-21s %5.2f us: %5.2fx (target %.1fx): %-7s  CPU %5.2f us over %5.2f us: %.2fx\n",
				c.name, idem, c.floor, floor, got, c.target, verdict,
				r.redis.cpuPerRequest(r.n), f.redis.cpuPerRequest(f.n), r.redis.cpuPerRequest(r.n)/f.redis.cpuPerRequest(f.n))
		}
	}
}
