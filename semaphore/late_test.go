package semaphore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/faultproxy"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

// TestLateGrantIsNotAPermit: one process reaches Redis through a proxy whose
// round trip (at least 1 s) is longer than its lease (900 ms) by more than
// the margin, so every permit it is granted is over on the client (at
// 810 ms) before the answer arrives, whatever the scheduling. TryAcquire
// must fail with ErrNotObtained, and a waiting Acquire must not return a
// permit while another process holds the only one (it did); it gives the
// late grants back without touching that one and tries again within its
// ctx. Fair and unfair alike.
func TestLateGrantIsNotAPermit(t *testing.T) {
	for _, fair := range []bool{false, true} {
		name := "unfair"
		if fair {
			name = "fair"
		}
		t.Run(name, func(t *testing.T) {
			// The two cases have a server and a proxy each and spend
			// their ~10 s waiting on the proxy's delays: side by side.
			t.Parallel()
			ctx := context.Background()
			srv := redistest.NewServer(t)
			proxy, err := faultproxy.New(srv.Addr())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { proxy.Close() })
			slow := newEnv(t, []string{proxy.Addr()}, semaphore.Options{Fair: fair, Lease: 900 * time.Millisecond})
			fast := newEnv(t, []string{srv.Addr()}, semaphore.Options{Fair: fair})
			sa, sb := slow.sem(t, "late", 1), fast.sem(t, "late", 1)
			p, err := sa.TryAcquire(ctx, 1) // connections up, scripts loaded
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Release(ctx); err != nil {
				t.Fatal(err)
			}
			proxy.SetLatency(500*time.Millisecond, 0)

			if p, err := sa.TryAcquire(ctx, 1); !errors.Is(err, semaphore.ErrNotObtained) {
				t.Fatalf("TryAcquire with a late grant = (permit %t), %v; want ErrNotObtained", p != nil, err)
			}

			actx, cancel := context.WithTimeout(ctx, 4*time.Second)
			defer cancel()
			type result struct {
				p   *semaphore.Permit
				err error
			}
			got := make(chan result, 1)
			go func() {
				p, err := sa.Acquire(actx, 1)
				got <- result{p, err}
			}()
			// B competes once A's late grant is held on the server, and gets
			// the permit when that grant's lease ends there.
			if !redistest.WaitFor(ctx, signalWait, func() bool {
				h, err := sb.Holders(ctx)
				return err == nil && len(h) > 0
			}) {
				t.Fatal("A's grant never held on the server")
			}
			bctx, bcancel := context.WithTimeout(ctx, signalWait)
			defer bcancel()
			pb, err := sb.Acquire(bctx, 1)
			if err != nil {
				t.Fatalf("B's Acquire: %v", err)
			}
			if r := <-got; !errors.Is(r.err, semaphore.ErrNotObtained) || !errors.Is(r.err, context.DeadlineExceeded) {
				t.Fatalf("A's Acquire with late grants while B holds = (permit %t), %v; want ErrNotObtained at its deadline", r.p != nil, r.err)
			}
			select {
			case <-pb.Lost():
				t.Fatalf("B lost its permit: %v", pb.Err())
			default:
			}
			if err := pb.Release(ctx); err != nil {
				t.Fatalf("B's Release = %v; A's give-backs must leave B's permit alone", err)
			}
		})
	}
}

// TestCloseGivesUpQueueingAttempt: a fair Acquire's first attempt queues
// the waiter on the server, its reply is lost on the way (the proxy drops
// replies), and Close gives the call up. Acquire returns ErrClosed, and
// the waiter must leave the queue all the same: left there, the next
// release would grant the permit to a waiter nobody is, for a lease
// (30 s). It stayed: Close's give-up skipped the leave a waiting
// Acquire's end makes.
func TestCloseGivesUpQueueingAttempt(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	proxy, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	// One connection, up before the replies are dropped: rueidis dials its
	// other pipelines on first use, and a handshake whose replies are
	// dropped never completes (the attempt then never reached Redis, 1 run
	// in 12).
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{proxy.Addr()}, DisableCache: true, PipelineMultiplex: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	sc, err := scriptcache.New(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := semaphore.NewManager(sc, semaphore.Options{Fair: true, Prefix: semaphore.DefaultPrefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mgr.Close)
	slow := &env{client: client, mgr: mgr, prefix: semaphore.DefaultPrefix}
	fast := newEnv(t, []string{srv.Addr()}, semaphore.Options{Fair: true})
	name := uniqueName(t)
	sa, sb := slow.sem(t, name, 1), fast.sem(t, name, 1)
	release(t, acquire(t, sa, 1)) // connections up, scripts loaded
	blocker := acquire(t, sb, 1)

	proxy.DropReplies(true)
	actx, cancel := context.WithTimeout(ctx, 3*signalWait)
	defer cancel()
	got := acquireAsync(actx, sa, 1)
	fast.waitQueued(t, name, 1)
	slow.mgr.Close()
	select {
	case r := <-got:
		if !errors.Is(r.err, semaphore.ErrClosed) {
			t.Fatalf("Acquire ended by Close = %v, want ErrClosed", r.err)
		}
	case <-time.After(2 * signalWait):
		t.Fatal("Acquire did not return after Close")
	}
	// The leave's request reaches the server although its reply is
	// dropped.
	fast.waitQueued(t, name, 0)
	release(t, blocker)
	wantAvailable(t, sb, 1)
}
