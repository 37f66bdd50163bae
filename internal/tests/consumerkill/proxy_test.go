package consumerkill

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// proxy is a TCP proxy between one consumer process and Redis that can
// hold a command. It reads the RESP commands the consumer sends and
// forwards them one by one; Redis's replies go back untouched. Once armed
// by holdFirst, the first command that matches is not forwarded but
// reported on held, and the connection it came on forwards nothing more
// until the test releases it: the consumer waits for the reply, stopped
// at that point, while its other connections (the lease's heartbeat) go
// on. A consumer killed then has sent the command to no one.
type proxy struct {
	ln     net.Listener
	target string
	held   chan *heldCmd // one at a time
	done   chan struct{} // closed by close

	mu     sync.Mutex
	match  func(args []string) bool // armed; nil when not
	conns  []net.Conn
	closed bool
	wg     sync.WaitGroup
}

// heldCmd is a command the proxy holds.
type heldCmd struct {
	at      time.Time
	release chan struct{} // closed: forward it, and what follows
}

// startProxy starts a proxy to the Redis at target; it is closed when the
// test ends.
func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, held: make(chan *heldCmd, 1), done: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// addr is the address the consumer connects to.
func (p *proxy) addr() string { return p.ln.Addr().String() }

// holdFirst arms the proxy: the next command for which match reports true
// (its arguments, the command's name first) is held.
func (p *proxy) holdFirst(match func(args []string) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.match = match
}

// waitHeld returns the held command; it fails the test if none is held
// within timeout, with the output of the consumer c.
func (p *proxy) waitHeld(t *testing.T, c *proc, timeout time.Duration) *heldCmd {
	t.Helper()
	select {
	case h := <-p.held:
		return h
	case <-time.After(timeout):
		t.Fatalf("%s: no command held after %v; its output:\n%s", c.name, timeout, c.output())
		return nil
	}
}

// isCredit matches the credit script (EVALSHA or EVAL) on the ledger of
// stream for the payment id.
func isCredit(stream, id string) func([]string) bool {
	return func(args []string) bool {
		name := strings.ToUpper(args[0])
		return (name == "EVALSHA" || name == "EVAL") && slices.Contains(args, creditsKey(stream)) && slices.Contains(args, id)
	}
}

// isXAck matches the XACK of the entry id.
func isXAck(id string) func([]string) bool {
	return func(args []string) bool { return strings.EqualFold(args[0], "XACK") && slices.Contains(args[1:], id) }
}

// close stops the proxy: it closes the listener and every connection,
// drops the command held, if any, and waits for its goroutines.
func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	close(p.done)
	p.wg.Wait()
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		p.conns = append(p.conns, c, s)
		p.wg.Add(2)
		p.mu.Unlock()
		go p.replies(c, s)
		go p.commands(c, s)
	}
}

// replies copies Redis's replies to the consumer.
func (p *proxy) replies(c, s net.Conn) {
	defer p.wg.Done()
	io.Copy(c, s)
	c.Close()
	s.Close()
}

// commands forwards the consumer's commands to Redis, one by one, and
// holds the one that matches the armed rule.
func (p *proxy) commands(c, s net.Conn) {
	defer p.wg.Done()
	defer c.Close()
	defer s.Close()
	r := bufio.NewReader(c)
	for {
		args, raw, err := readCommand(r)
		if err != nil {
			return
		}
		if p.take(args) {
			h := &heldCmd{at: time.Now(), release: make(chan struct{})}
			select {
			case p.held <- h:
			case <-p.done:
				return
			}
			select {
			case <-h.release:
			case <-p.done:
				return
			}
		}
		if _, err := s.Write(raw); err != nil {
			return
		}
	}
}

// take reports whether args match the armed rule, and disarms it if so.
func (p *proxy) take(args []string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.match == nil || !p.match(args) {
		return false
	}
	p.match = nil
	return true
}

// readCommand reads a command as a client sends it, a RESP array of bulk
// strings, and returns its arguments and its bytes.
func readCommand(r *bufio.Reader) (args []string, raw []byte, err error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, nil, err
	}
	n, err := respLength(line, '*')
	if err != nil || n < 1 {
		return nil, nil, fmt.Errorf("not a command: %q", line)
	}
	raw = append(raw, line...)
	for range n {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, nil, err
		}
		size, err := respLength(line, '$')
		if err != nil {
			return nil, nil, err
		}
		arg := make([]byte, size+2) // and its CRLF
		if _, err := io.ReadFull(r, arg); err != nil {
			return nil, nil, err
		}
		raw = append(append(raw, line...), arg...)
		args = append(args, string(arg[:size]))
	}
	return args, raw, nil
}

// respLength parses a RESP header line such as "*3\r\n" or "$5\r\n".
func respLength(line string, kind byte) (int, error) {
	if len(line) < 4 || line[0] != kind || !strings.HasSuffix(line, "\r\n") {
		return 0, fmt.Errorf("want a %c header, got %q", kind, line)
	}
	n, err := strconv.Atoi(line[1 : len(line)-2])
	if err != nil || n < 0 || n > 64<<20 {
		return 0, errors.Join(fmt.Errorf("bad %c header %q", kind, line), err)
	}
	return n, nil
}
