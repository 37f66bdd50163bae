package main

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseCommandStats(t *testing.T) {
	info := "# Commandstats\r\n" +
		"cmdstat_evalsha:calls=12,usec=345,usec_per_call=28.75,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_client|setinfo:calls=2,usec=3,usec_per_call=1.50,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_set:calls=24,usec=48,usec_per_call=2.00,rejected_calls=1,failed_calls=0\r\n"
	got, err := parseCommandStats(info)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]cmdStat{
		"evalsha":        {calls: 12, usec: 345},
		"client|setinfo": {calls: 2, usec: 3},
		"set":            {calls: 24, usec: 48},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if got, err := parseCommandStats("# Commandstats\r\n"); err != nil || len(got) != 0 {
		t.Errorf("no command: got %v, %v", got, err)
	}
	for _, bad := range []string{
		"cmdstat_get:calls=x,usec=1",
		"cmdstat_get:calls=1",
		"cmdstat_get",
	} {
		if _, err := parseCommandStats(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestParseCPU(t *testing.T) {
	const main = "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.250000\r\nused_cpu_sys_children:0.000000\r\n" +
		"used_cpu_user_children:0.000000\r\nused_cpu_sys_main_thread:1.000000\r\nused_cpu_user_main_thread:2.000000\r\n"
	if s, mainThread, err := parseCPU(main); err != nil || s != 3 || !mainThread {
		t.Errorf("main thread: got %v %v %v, want 3 true", s, mainThread, err)
	}
	// Before Redis 6.2: the server's only.
	old := strings.Join(strings.Split(main, "\r\n")[:5], "\r\n")
	if s, mainThread, err := parseCPU(old); err != nil || s != 3.75 || mainThread {
		t.Errorf("whole server: got %v %v %v, want 3.75 false", s, mainThread, err)
	}
	if _, _, err := parseCPU("# CPU\r\n"); err == nil {
		t.Error("no fields: no error")
	}
}

// TestSplit holds that the calls made inside scripts are not added to the
// command time: their time is already in their script's.
func TestSplit(t *testing.T) {
	before := serverSnapshot{
		cmds: map[string]cmdStat{"evalsha": {calls: 1, usec: 10}, "info": {calls: 1, usec: 50}},
		sent: map[string]int64{"evalsha": 1, "set": 5},
	}
	after := serverSnapshot{
		cmds: map[string]cmdStat{
			"evalsha":          {calls: 11, usec: 110}, // 10 calls, 100 us
			"set":              {calls: 25, usec: 50},  // 5 sent, 20 inside the scripts
			"get":              {calls: 10, usec: 5},   // all inside the scripts
			"hello":            {calls: 2, usec: 8},    // a new connection: unseen by the hooks
			"info":             {calls: 3, usec: 150},  // the statistics' own
			"config|resetstat": {calls: 1, usec: 40},
		},
		sent: map[string]int64{"evalsha": 11, "set": 10},
	}
	top, in := split(before, after)
	wantTop := []cmdFigure{{"evalsha", 10, 100}, {"set", 5, 10}, {"hello", 2, 8}}
	wantIn := []cmdFigure{{"set", 20, 40}, {"get", 10, 5}}
	if !reflect.DeepEqual(top, wantTop) {
		t.Errorf("sent: got %v, want %v", top, wantTop)
	}
	if !reflect.DeepEqual(in, wantIn) {
		t.Errorf("inside scripts: got %v, want %v", in, wantIn)
	}

	// Without scripts, every call was sent, whatever the hooks saw.
	before.cmds, after.cmds = nil, map[string]cmdStat{"set": {calls: 4, usec: 8}}
	top, in = split(before, after)
	if want := []cmdFigure{{"set", 4, 8}}; !reflect.DeepEqual(top, want) || len(in) != 0 {
		t.Errorf("no script: got %v and %v, want %v", top, in, want)
	}
}

func TestPhaseStatsFormat(t *testing.T) {
	p := phaseStats{
		top:        []cmdFigure{{"evalsha", 20, 100}},
		inScripts:  []cmdFigure{{"get", 20, 10}},
		usec:       100,
		cpu:        0.0002,
		mainThread: true,
	}
	const want = "redis: commands 10.00 us/req, CPU 20.00 us/req (main thread): evalsha 2.00/req 5.0us; inside the scripts, not added: get 2.00/req 0.5us"
	if got := p.format(10); got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}
