package mysqltest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"
)

// TestProcCrashRestart: a connection logged in to a Proc's server breaks
// at Crash, new ones are refused while it is down, Restart serves again on
// the same DSN, and the server's directory is gone when the test ends.
// The package imports no driver, so the test speaks the protocol's few
// packets itself (greeting, login as root without a password, COM_PING);
// that a commit acknowledged before Crash survives it is tested where a
// driver is (internal/tests/e2e's TestMySQLProcCrashKeepsCommits).
func TestProcCrashRestart(t *testing.T) {
	var dir string
	t.Run("proc", func(t *testing.T) {
		p := StartProc(t)
		p.mu.Lock()
		dir, port, args := p.srv.dir, p.srv.port, p.srv.cmd.Args
		p.mu.Unlock()
		shared.mu.Lock()
		if shared.srv != nil && shared.srv.dir == dir {
			t.Error("StartProc returned the shared server")
		}
		shared.mu.Unlock()
		if i := slices.Index(args, "--innodb_flush_log_at_trx_commit=1"); i < 0 ||
			slices.ContainsFunc(args[i+1:], func(a string) bool { return a == "--innodb-flush-log-at-trx-commit=0" }) {
			t.Errorf("mariadbd %v: want innodb_flush_log_at_trx_commit=1 last", args)
		}
		dsn := p.DSN()
		if want := "root@tcp(127.0.0.1:" + strconv.Itoa(port) + ")/?parseTime=true"; dsn != want {
			t.Fatalf("DSN %q, want %q", dsn, want)
		}

		c := login(t, port)
		defer c.Close()
		if err := ping(c); err != nil {
			t.Fatalf("COM_PING before the crash: %v", err)
		}
		p.Crash()
		broken(t, c)
		if err := greeting(port); err == nil {
			t.Fatal("the crashed server sent a greeting")
		}
		p.Restart()
		if p.DSN() != dsn {
			t.Errorf("DSN after the restart %q, want %q", p.DSN(), dsn)
		}
		c2 := login(t, port)
		defer c2.Close()
		if err := ping(c2); err != nil {
			t.Fatalf("COM_PING after the restart: %v", err)
		}
		// Twice, to see Crash and Restart of a restarted server.
		p.Crash()
		broken(t, c2)
		p.Restart()
		c3 := login(t, port)
		defer c3.Close()
		if err := ping(c3); err != nil {
			t.Fatalf("COM_PING after the second restart: %v", err)
		}
	})
	if dir == "" {
		return // skipped
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the Proc's directory %s after its test: %v, want it removed", dir, err)
	}
}

// login connects to the server on port and logs in as root without a
// password (mysql_native_password with an empty response).
func login(t testing.TB, port int) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	hello, err := readPacket(c)
	if err != nil || len(hello) == 0 || hello[0] != 10 {
		c.Close()
		t.Fatalf("greeting %x: %v", hello, err)
	}
	const (
		longPassword      = 0x1
		protocol41        = 0x200
		secureConnection  = 0x8000
		utf8mb4GeneralCI  = 45
		maxPacket         = 1 << 24
		handshakeResponse = 1 // its sequence number
	)
	resp := binary.LittleEndian.AppendUint32(nil, longPassword|protocol41|secureConnection)
	resp = binary.LittleEndian.AppendUint32(resp, maxPacket)
	resp = append(resp, utf8mb4GeneralCI)
	resp = append(resp, make([]byte, 23)...)
	resp = append(resp, "root\x00"...)
	resp = append(resp, 0) // an empty auth response
	if err := writePacket(c, handshakeResponse, resp); err != nil {
		c.Close()
		t.Fatal(err)
	}
	if ok, err := readPacket(c); err != nil || len(ok) == 0 || ok[0] != 0 {
		c.Close()
		t.Fatalf("login as root: %q, %v; want an OK packet", ok, err)
	}
	return c
}

// broken checks that c, a connection of a crashed server, is broken: a
// COM_PING fails at once, not for want of an answer.
func broken(t testing.TB, c net.Conn) {
	t.Helper()
	err := ping(c)
	var ne net.Error
	switch {
	case err == nil:
		t.Fatal("a connection of the crashed server still answers COM_PING")
	case errors.As(err, &ne) && ne.Timeout():
		t.Fatalf("a connection of the crashed server: COM_PING %v, want it broken", err)
	}
}

// ping sends COM_PING on c and reads its OK packet.
func ping(c net.Conn) error {
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if err := writePacket(c, 0, []byte{0x0e}); err != nil {
		return err
	}
	ok, err := readPacket(c)
	if err != nil {
		return err
	}
	if len(ok) == 0 || ok[0] != 0 {
		return fmt.Errorf("COM_PING answered %q, want an OK packet", ok)
	}
	return nil
}

func writePacket(c net.Conn, seq byte, payload []byte) error {
	n := len(payload)
	_, err := c.Write(append([]byte{byte(n), byte(n >> 8), byte(n >> 16), seq}, payload...))
	return err
}

func readPacket(c net.Conn) ([]byte, error) {
	var h [4]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return nil, err
	}
	n := int(h[0]) | int(h[1])<<8 | int(h[2])<<16
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		return nil, err
	}
	if n > 0 && b[0] == 0xff {
		return b, errors.New("error packet: " + string(b[min(n, 9):]))
	}
	return b, nil
}
