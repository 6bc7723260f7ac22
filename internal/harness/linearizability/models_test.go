package linearizability

import (
	"testing"

	"github.com/anishathalye/porcupine"
)

// TestModels checks the models on small hand-made histories, so that a
// model that accepts everything (or nothing) is caught without Redis.
// Times are [call, return] on one clock.
func TestModels(t *testing.T) {
	op := func(client int, name string, v int64, call, ret int64) record {
		return record{Client: client, Op: name, Val: v, Call: call, Ret: ret}
	}
	allow := func(client int, cost int64, ok bool, call, ret int64) record {
		return record{Client: client, Op: opAllow, Val: cost, OK: ok, Call: call, Ret: ret}
	}
	cases := []struct {
		name  string
		model porcupine.Model
		hist  []record
		want  porcupine.CheckResult
	}{
		{"lock/sequential", lockModel, []record{
			op(0, opAcquire, 5, 0, 1), op(0, opRelease, 5, 2, 3), op(1, opAcquire, 7, 4, 5), op(1, opRelease, 7, 6, 7),
		}, porcupine.Ok},
		{"lock/hand-off-while-releasing", lockModel, []record{
			// 1's acquire overlaps 0's release: it may take effect after it.
			op(0, opAcquire, 5, 0, 1), op(1, opAcquire, 7, 2, 5), op(0, opRelease, 5, 3, 4), op(1, opRelease, 7, 6, 7),
		}, porcupine.Ok},
		{"lock/two-holders", lockModel, []record{
			op(0, opAcquire, 5, 0, 2), op(1, opAcquire, 7, 1, 3), op(0, opRelease, 5, 4, 5), op(1, opRelease, 7, 4, 6),
		}, porcupine.Illegal},
		{"lock/token-repeats", lockModel, []record{
			op(0, opAcquire, 5, 0, 1), op(0, opRelease, 5, 2, 3), op(1, opAcquire, 5, 4, 5), op(1, opRelease, 5, 6, 7),
		}, porcupine.Illegal},
		{"lock/token-goes-back", lockModel, []record{
			op(0, opAcquire, 9, 0, 1), op(0, opRelease, 9, 2, 3), op(1, opAcquire, 7, 4, 5),
		}, porcupine.Illegal},
		{"lock/token-order-decides", lockModel, []record{
			// Concurrent acquires: only the order 7 then 9 is legal.
			op(0, opAcquire, 9, 0, 10), op(1, opAcquire, 7, 0, 3), op(1, opRelease, 7, 4, 5), op(0, opRelease, 9, 11, 12),
		}, porcupine.Ok},
		{"lock/busy-while-held", lockModel, []record{
			op(0, opAcquire, 5, 0, 1), op(1, opBusy, 0, 2, 3), op(0, opRelease, 5, 4, 5), op(1, opBusy, 0, 4, 6),
		}, porcupine.Ok},
		{"lock/busy-while-free", lockModel, []record{
			op(0, opAcquire, 5, 0, 1), op(0, opRelease, 5, 2, 3), op(1, opBusy, 0, 4, 5),
		}, porcupine.Illegal},
		{"lock/release-by-non-holder", lockModel, []record{
			op(0, opAcquire, 5, 0, 1), op(1, opRelease, 4, 2, 3),
		}, porcupine.Illegal},
		{"counter/sequential", counterModel, []record{
			op(0, opIncr, 0, 0, 1), op(1, opIncr, 1, 2, 3), op(0, opIncr, 2, 4, 5),
		}, porcupine.Ok},
		{"counter/lost-update", counterModel, []record{
			op(0, opIncr, 0, 0, 2), op(1, opIncr, 0, 1, 3), op(0, opIncr, 1, 4, 5),
		}, porcupine.Illegal},
		{"counter/concurrent-either-order", counterModel, []record{
			op(0, opIncr, 1, 0, 3), op(1, opIncr, 0, 1, 2),
		}, porcupine.Ok},
		{"semaphore/at-capacity", semaphoreModel(2), []record{
			op(0, opAcquire, 1, 0, 1), op(1, opAcquire, 1, 0, 1), op(2, opAcquire, 2, 0, 5),
			op(0, opRelease, 1, 2, 3), op(1, opRelease, 1, 2, 4), op(2, opRelease, 2, 6, 7),
		}, porcupine.Ok},
		{"semaphore/over-capacity", semaphoreModel(2), []record{
			op(0, opAcquire, 1, 0, 1), op(1, opAcquire, 1, 0, 1), op(2, opAcquire, 1, 0, 1),
			op(0, opRelease, 1, 2, 3), op(1, opRelease, 1, 2, 3), op(2, opRelease, 1, 2, 3),
		}, porcupine.Illegal},
		{"semaphore/weight-over-capacity", semaphoreModel(2), []record{
			op(0, opAcquire, 1, 0, 1), op(1, opAcquire, 2, 0, 1), op(0, opRelease, 1, 2, 3), op(1, opRelease, 2, 2, 3),
		}, porcupine.Illegal},
		{"semaphore/busy-when-full", semaphoreModel(2), []record{
			op(0, opAcquire, 1, 0, 1), op(1, opBusy, 2, 2, 3), op(2, opBusy, 1, 2, 3), op(3, opAcquire, 1, 2, 3),
		}, porcupine.Ok},
		{"semaphore/busy-with-room", semaphoreModel(2), []record{
			op(0, opAcquire, 1, 0, 1), op(1, opBusy, 1, 2, 3),
		}, porcupine.Illegal},
		{"limiter/exact", limiterModel(2), []record{
			allow(0, 1, true, 0, 1), allow(1, 1, false, 0, 3), allow(2, 1, true, 0, 2), allow(0, 1, false, 4, 5),
		}, porcupine.Ok},
		{"limiter/over-limit", limiterModel(2), []record{
			allow(0, 1, true, 0, 1), allow(1, 1, true, 0, 1), allow(2, 1, true, 0, 1),
		}, porcupine.Illegal},
		{"limiter/denied-with-room", limiterModel(2), []record{
			allow(0, 1, true, 0, 1), allow(0, 1, false, 2, 3),
		}, porcupine.Illegal},
		{"limiter/cost-does-not-fit", limiterModel(2), []record{
			allow(0, 1, true, 0, 1), allow(0, 2, false, 2, 3), allow(1, 1, true, 4, 5),
		}, porcupine.Ok},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := porcupine.CheckOperationsTimeout(c.model, operations(c.hist), checkTimeout); got != c.want {
				t.Errorf("got %s, want %s", got, c.want)
			}
		})
	}
}
