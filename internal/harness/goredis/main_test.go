package goredis_test

import (
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// TestMain: the shared servers stop, nothing is left running (goleak),
// and a run near its -timeout says where it is stuck (redistest.Main).
func TestMain(m *testing.M) { redistest.Main(m) }
