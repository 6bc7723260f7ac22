// Command inventory decrements stock in a SQL database (an embedded,
// pure-Go SQLite) under a sluice lock, and shows why the lock's fencing
// token belongs in the UPDATE: a holder that was paused past its lease
// still believes it holds the lock when it wakes up, and only the database
// can refuse its write.
//
//	go run ./inventory -redis 127.0.0.1:6379
//
// What it does: a second process (this program again) takes the lock on
// the item with a short lease and is then frozen with SIGSTOP, as a long GC
// pause or a suspended VM would freeze it. Its watchdog cannot renew the
// lease, which expires; this process takes the lock with a larger token
// and sells one item. The frozen process is resumed and writes at once,
// before its watchdog has noticed the loss; the UPDATE's
// "last_token < token" refuses it. Buyers in this process then sell the
// rest, and the stock ends at exactly zero.
//
// SIGSTOP needs a Unix-like system.
package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	_ "github.com/glebarez/go-sqlite" // database/sql driver "sqlite", no cgo
	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice"
	"github.com/sluicekit/sluice/mutex"
)

// config is what the command line sets; the paused holder gets it through
// the environment.
type config struct {
	redis  string        // host:port of Redis
	db     string        // SQLite file
	sku    string        // the item, and the lock's name
	stock  int           // items in stock at the start
	lease  time.Duration // the paused holder's watchdog lease
	prefix string        // starts every Redis key
}

// roleEnv, set to "holder", makes the program the process that is paused.
const roleEnv = "INVENTORY_ROLE"

func main() {
	if os.Getenv(roleEnv) == "holder" {
		if err := holder(context.Background(), configFromEnv(), os.Stdin, os.Stdout); err != nil {
			log.Fatal("holder: ", err)
		}
		return
	}
	c := config{}
	flag.StringVar(&c.redis, "redis", "127.0.0.1:6379", "Redis `host:port`")
	flag.StringVar(&c.db, "db", filepath.Join(os.TempDir(), "sluice-inventory.db"), "SQLite database `file`")
	flag.StringVar(&c.sku, "sku", "widget", "the item sold")
	flag.IntVar(&c.stock, "stock", 5, "items in stock at the start")
	flag.DurationVar(&c.lease, "lease", time.Second, "the paused holder's lease")
	flag.StringVar(&c.prefix, "prefix", "example:inventory:", "start of every Redis key")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := run(ctx, c, os.Stdout)
	if err != nil {
		log.Fatal(err)
	}
	if !res.StaleRefused {
		log.Fatal("the paused holder's stale write was accepted")
	}
}

// result is what a run found, for the test.
type result struct {
	StaleToken   int64 // the paused holder's token
	Token        int64 // the token of the sale made while it was paused
	StaleRefused bool  // the database refused the paused holder's write
	Sold         int   // items sold, all in this process
	Stock        int   // left in the database at the end
	LastToken    int64 // stored with the last sale
}

// run seeds the stock, stages the paused holder, sells the rest and
// reports, printing what happens to out.
func run(ctx context.Context, c config, out io.Writer) (*result, error) {
	db, err := openDB(c.db)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	if err := seed(ctx, db, c.sku, c.stock); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "stock of %q: %d, in %s\n", c.sku, c.stock, c.db)

	locks, closeLocks, err := newLocker(ctx, c, 0)
	if err != nil {
		return nil, err
	}
	defer closeLocks()

	// Holder A: this program again, in a process of its own.
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), roleEnv+"=holder", "INVENTORY_REDIS="+c.redis, "INVENTORY_DB="+c.db,
		"INVENTORY_SKU="+c.sku, "INVENTORY_LEASE="+c.lease.String(), "INVENTORY_PREFIX="+c.prefix)
	cmd.Stderr = os.Stderr
	toA, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	fromA, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	lines := bufio.NewScanner(fromA)
	line, err := readLine(lines, "locked ")
	if err != nil {
		return nil, fmt.Errorf("holder: %w", err)
	}
	res := &result{}
	res.StaleToken, _ = strconv.ParseInt(line, 10, 64)
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "A (pid %d) locked %q with token %d, lease %s, and is now frozen (SIGSTOP): its watchdog cannot renew\n",
		cmd.Process.Pid, c.sku, res.StaleToken, c.lease)

	// B: this process. Lock waits until A's lease has run out.
	start := time.Now()
	err = sell(ctx, locks, db, c.sku, func(token int64, sold bool) {
		res.Token = token
		fmt.Fprintf(out, "B locked %q after %s, when A's lease ran out, with token %d; sold one: %v\n",
			c.sku, time.Since(start).Round(10*time.Millisecond), token, sold)
		if sold {
			res.Sold++
		}
	})
	if err != nil {
		return nil, err
	}

	// A wakes up and writes with its old token, as it would after a pause
	// that struck between its last check and its write.
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return nil, err
	}
	if _, err := io.WriteString(toA, "write\n"); err != nil {
		return nil, err
	}
	verdict, err := readLine(lines, "write ")
	if err != nil {
		return nil, fmt.Errorf("holder: %w", err)
	}
	res.StaleRefused = strings.HasPrefix(verdict, "refused")
	fmt.Fprintf(out, "A resumed (SIGCONT) and wrote with token %d: %s\n", res.StaleToken, verdict)
	_ = toA.Close()
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("holder: %w", err)
	}

	// Four buyers sell the rest, each sale under the lock.
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			for {
				var sold bool
				err := sell(ctx, locks, db, c.sku, func(_ int64, ok bool) { sold = ok })
				if err != nil || !sold {
					errs[i] = err
					return
				}
				mu.Lock()
				res.Sold++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := db.QueryRowContext(ctx, `SELECT quantity, last_token FROM stock WHERE sku = ?`, c.sku).
		Scan(&res.Stock, &res.LastToken); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "four buyers sold the rest: %d sold in all, %d left, last token stored %d\n", res.Sold, res.Stock, res.LastToken)
	return res, nil
}

// sell takes the item's lock, sells one if any is left, and unlocks;
// done is told the token and whether it sold.
func sell(ctx context.Context, locks *mutex.Locker, db *sql.DB, sku string, done func(token int64, sold bool)) error {
	m, err := locks.NewMutex(sku)
	if err != nil {
		return err
	}
	lockCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return m.Do(lockCtx, func(ctx context.Context) error {
		sold, _, err := decrement(ctx, db, sku, m.Token())
		if err != nil {
			return err
		}
		done(m.Token(), sold)
		return nil
	})
}

// decrement sells one item with the lock's fencing token. The token is
// checked and stored in the same UPDATE: a write whose token is not above
// the last one stored comes from a holder whose lock has since passed to
// someone else, and changes nothing. One sale per lock hold: a holder that
// writes several times under one hold would compare with <= instead.
func decrement(ctx context.Context, db *sql.DB, sku string, token int64) (sold bool, why string, err error) {
	r, err := db.ExecContext(ctx,
		`UPDATE stock SET quantity = quantity - 1, last_token = ? WHERE sku = ? AND quantity > 0 AND last_token < ?`,
		token, sku, token)
	if err != nil {
		return false, "", err
	}
	if n, err := r.RowsAffected(); err != nil || n == 1 {
		return n == 1, "", err
	}
	var q int
	var last int64
	if err := db.QueryRowContext(ctx, `SELECT quantity, last_token FROM stock WHERE sku = ?`, sku).Scan(&q, &last); err != nil {
		return false, "", err
	}
	if last >= token {
		return false, fmt.Sprintf("stale token %d: the database already has %d", token, last), nil
	}
	return false, "sold out", nil
}

// holder is the process that gets paused: it locks, says its token, waits
// for a line on in (it is frozen meanwhile), then writes with that token
// without checking first, and says what the database answered.
func holder(ctx context.Context, c config, in io.Reader, out io.Writer) error {
	db, err := openDB(c.db)
	if err != nil {
		return err
	}
	defer db.Close()
	locks, closeLocks, err := newLocker(ctx, c, c.lease)
	if err != nil {
		return err
	}
	defer closeLocks()
	m, err := locks.NewMutex(c.sku)
	if err != nil {
		return err
	}
	if err := m.Lock(ctx); err != nil {
		return err
	}
	fmt.Fprintf(out, "locked %d\n", m.Token())
	if _, err := bufio.NewReader(in).ReadString('\n'); err != nil {
		return err
	}
	// A real holder would check m.Lost() here too, and should; but a pause
	// can fall between that check and the write, so only the token in the
	// UPDATE makes the write safe. This one writes at once.
	sold, why, err := decrement(ctx, db, c.sku, m.Token())
	switch {
	case err != nil:
		return err
	case sold:
		fmt.Fprintln(out, "write accepted")
	default:
		fmt.Fprintf(out, "write refused by the database (%s)\n", why)
	}
	_ = m.Unlock(ctx) // the lock is long gone: ErrNotHeld, nothing else to do
	return nil
}

func configFromEnv() config {
	lease, _ := time.ParseDuration(os.Getenv("INVENTORY_LEASE"))
	return config{redis: os.Getenv("INVENTORY_REDIS"), db: os.Getenv("INVENTORY_DB"), sku: os.Getenv("INVENTORY_SKU"),
		lease: lease, prefix: os.Getenv("INVENTORY_PREFIX")}
}

// newLocker connects to Redis; lease is the watchdog lease, 0 for the
// default.
func newLocker(ctx context.Context, c config, lease time.Duration) (*mutex.Locker, func(), error) {
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{c.redis}, DisableCache: true})
	if err != nil {
		return nil, nil, fmt.Errorf("redis %s: %w", c.redis, err)
	}
	sc, err := sluice.New(ctx, client)
	if err != nil {
		client.Close()
		return nil, nil, fmt.Errorf("redis %s: %w", c.redis, err)
	}
	locks, err := mutex.NewLocker(sc, mutex.Options{WatchdogLease: lease, Prefix: c.prefix})
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	return locks, func() { locks.Close(); client.Close() }, nil
}

// openDB opens the SQLite file; several processes write it, so a writer
// waits for another's transaction instead of failing with SQLITE_BUSY.
func openDB(path string) (*sql.DB, error) {
	db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		return nil, err
	}
	_, err = db.Exec(`CREATE TABLE IF NOT EXISTS stock (
		sku        TEXT PRIMARY KEY,
		quantity   INTEGER NOT NULL CHECK (quantity >= 0),
		last_token INTEGER NOT NULL -- the fencing token of the last write
	)`)
	if err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// seed sets the item's stock and forgets earlier tokens.
func seed(ctx context.Context, db *sql.DB, sku string, stock int) error {
	_, err := db.ExecContext(ctx, `INSERT INTO stock (sku, quantity, last_token) VALUES (?, ?, 0)
		ON CONFLICT (sku) DO UPDATE SET quantity = excluded.quantity, last_token = 0`, sku, stock)
	return err
}

// readLine returns the rest of the next line that starts with prefix.
func readLine(s *bufio.Scanner, prefix string) (string, error) {
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), prefix); ok {
			return rest, nil
		}
	}
	if err := s.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("exited before saying %q", strings.TrimSpace(prefix))
}
