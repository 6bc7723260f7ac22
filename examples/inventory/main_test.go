package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// TestMain lets the test binary play the paused holder, as the program
// does: run starts os.Executable() with roleEnv set.
func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) == "holder" {
		if err := holder(context.Background(), configFromEnv(), os.Stdin, os.Stdout); err != nil {
			os.Stderr.WriteString("holder: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestPausedHolderRefused runs the program: holder A, a separate process,
// locks with a 300ms lease and is frozen with SIGSTOP; B takes the lock
// after the lease with a larger token and sells one; A resumes and writes
// with its old token, which the database refuses. The stock then ends at
// exactly zero, every item sold once.
func TestPausedHolderRefused(t *testing.T) {
	srv := redistest.NewServer(t)
	const stock = 5
	c := config{redis: srv.Addr(), db: filepath.Join(t.TempDir(), "inventory.db"), sku: "widget",
		stock: stock, lease: 300 * time.Millisecond, prefix: "test:"}
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := run(ctx, c, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !res.StaleRefused {
		t.Error("the paused holder's write was accepted, want refused")
	}
	if res.Token <= res.StaleToken {
		t.Errorf("token of the sale during the pause %d, want above the paused holder's %d", res.Token, res.StaleToken)
	}
	if res.Sold != stock || res.Stock != 0 {
		t.Errorf("sold %d, %d left; want %d sold, 0 left", res.Sold, res.Stock, stock)
	}
	if res.LastToken < res.Token {
		t.Errorf("last token stored %d, want at least %d (tokens only grow)", res.LastToken, res.Token)
	}

	// The database itself, read afresh: the paused holder's token is not
	// the last one stored, and nothing went below zero.
	db, err := openDB(c.db)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var q int
	var last int64
	if err := db.QueryRow(`SELECT quantity, last_token FROM stock WHERE sku = ?`, c.sku).Scan(&q, &last); err != nil {
		t.Fatal(err)
	}
	if q != 0 || last == res.StaleToken {
		t.Errorf("database: quantity %d, last_token %d; want 0 and not the stale %d", q, last, res.StaleToken)
	}
}
