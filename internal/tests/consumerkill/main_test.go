package consumerkill

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/redistest"
)

// TestMain fails the run if a test leaves a goroutine behind, stops the
// shared redis-server and removes the consumer binary.
func TestMain(m *testing.M) { leakcheck.Main(cleanup{redistest.Wrap(m)}) }

// cleanup removes the consumer binary after the tests.
type cleanup struct{ m leakcheck.M }

func (c cleanup) Run() int {
	defer func() {
		if build.dir != "" {
			os.RemoveAll(build.dir)
		}
	}()
	return c.m.Run()
}

// build is the consumer binary, built once per test binary.
var build struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// consumerBinary builds examples/consumer (without -race, so that it
// builds and runs quickly) and returns its path. It builds in the examples
// module's directory, so that this module need not require that one.
func consumerBinary(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			build.err = fmt.Errorf("the go command, to build the program: %w", err)
			return
		}
		examples, err := filepath.Abs(filepath.Join("..", "..", "..", "examples"))
		if err != nil {
			build.err = err
			return
		}
		if build.dir, build.err = os.MkdirTemp("", "idem-consumer-*"); build.err != nil {
			return
		}
		build.bin = filepath.Join(build.dir, "consumer")
		cmd := exec.Command(goBin, "build", "-o", build.bin, "./consumer")
		cmd.Dir = examples
		cmd.Env = append(os.Environ(), "GOFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = fmt.Errorf("go build ./consumer in %s: %w\n%s", examples, err, out)
		}
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.bin
}
