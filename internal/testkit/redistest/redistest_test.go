package redistest

import (
	"path/filepath"
	"testing"
)

// TestServerBinary: the servers run the binary SLUICE_REDIS_SERVER names
// (redis-server by default), so a run meant for Valkey cannot pass on Redis
// by mistake. INFO server gives the executable's path, which is the one
// the server was started with.
func TestServerBinary(t *testing.T) {
	s := NewServer(t)
	info, err := s.Do("INFO", "server")
	if err != nil {
		t.Fatal(err)
	}
	exe := infoField(info, "executable")
	if got, want := filepath.Base(exe), filepath.Base(ServerBinary()); got != want {
		t.Errorf("INFO server executable = %q; want a %s", exe, want)
	}
	for _, k := range []string{"server_name", "valkey_version", "redis_version"} {
		if v := infoField(info, k); v != "" {
			t.Logf("%s: %s", k, v)
		}
	}
}
