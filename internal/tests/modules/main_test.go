package modules

import (
	"testing"

	"github.com/idemkit/idem/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }
