package rls_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/envoy/rls"
)

// TestWatch: the Watcher's own goroutine finds a changed file and loads
// it, tells a bad one to OnError once with its reason while the last good
// configuration stays, and stops on Close (goleak checks it in TestMain).
func TestWatch(t *testing.T) {
	dir := t.TempDir()
	if err := writeFile(dir+"/a.yaml", "domain: one\n"); err != nil {
		t.Fatal(err)
	}
	loads := make(chan *rls.Config, 10)
	errs := make(chan error, 10)
	w, err := rls.Watch([]string{dir}, rls.WatchOptions{
		Interval: 10 * time.Millisecond,
		OnLoad:   func(c *rls.Config) { loads <- c },
		OnError:  func(err error) { errs <- err },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if c := <-loads; strings.Join(c.Domains(), ",") != "one" {
		t.Fatalf("first load: %v", c.Domains())
	}
	if err := writeFile(dir+"/b.yml", "domain: two\n"); err != nil {
		t.Fatal(err)
	}
	if c := <-loads; strings.Join(c.Domains(), ",") != "one,two" {
		t.Fatalf("after adding b.yml: %v", c.Domains())
	}
	if err := writeFile(dir+"/b.yml", "domain: two\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"); err != nil {
		t.Fatal(err)
	}
	err = <-errs
	if !errors.Is(err, rls.ErrConfig) || !strings.Contains(err.Error(), "b.yml") || !strings.Contains(err.Error(), "fortnight") {
		t.Fatalf("OnError: %v, want the file and the reason", err)
	}
	if got := strings.Join(w.Config().Domains(), ","); got != "one,two" {
		t.Fatalf("after a bad file: %v, want the last good", got)
	}
	// Fixed again: loaded.
	if err := writeFile(dir+"/b.yml", "domain: three\n"); err != nil {
		t.Fatal(err)
	}
	if c := <-loads; strings.Join(c.Domains(), ",") != "one,three" {
		t.Fatalf("after the fix: %v", c.Domains())
	}
	select {
	case err := <-errs:
		t.Fatalf("a bad file told twice: %v", err)
	default:
	}
}

func TestWatchFirstLoadFails(t *testing.T) {
	dir := t.TempDir()
	if err := writeFile(dir+"/a.yaml", "domain: [\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := rls.Watch([]string{dir}, rls.WatchOptions{}); !errors.Is(err, rls.ErrConfig) {
		t.Fatalf("err %v, want ErrConfig", err)
	}
	if _, err := rls.Watch([]string{dir + "/missing"}, rls.WatchOptions{}); !errors.Is(err, rls.ErrConfig) {
		t.Fatalf("missing path: %v, want ErrConfig", err)
	}
}
