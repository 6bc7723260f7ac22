package linearizability

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// Operation names in records.
const (
	opAcquire = "acquire" // Val: fencing token (lock) or weight (semaphore)
	opRelease = "release" // Val: the token or weight being given back
	opIncr    = "incr"    // Val: the counter value read; the section wrote Val+1
	opAllow   = "allow"   // Val: cost; OK: the decision
	opBusy    = "busy"    // a TryLock or TryAcquire that failed; Val: the weight asked
)

// lockState is the sequential specification of a lock with fencing tokens:
// who holds it (by token, 0 for nobody) and the last token issued.
type lockState struct {
	holder, last int64
}

// lockModel is a mutual-exclusion lock whose acquisitions carry fencing
// tokens. An acquire is legal only when nobody holds the lock and its token
// is greater than every earlier one; a release only by the current holder.
// So a history in which two holders overlap in real time (each acquire
// returned before the other's release was called), or a token does not
// increase, has no legal order. A TryLock that failed is legal only while
// someone holds the lock: a lock that turns callers away when free fails
// too.
var lockModel = porcupine.Model{
	Init: func() any { return lockState{} },
	Step: func(state, input, _ any) (bool, any) {
		s, in := state.(lockState), input.(record)
		switch in.Op {
		case opAcquire:
			if s.holder != 0 || in.Val <= s.last {
				return false, s
			}
			return true, lockState{holder: in.Val, last: in.Val}
		case opRelease:
			if s.holder == 0 || s.holder != in.Val {
				return false, s
			}
			return true, lockState{last: s.last}
		case opBusy:
			return s.holder != 0, s
		}
		return false, s
	},
	DescribeOperation: describe,
	DescribeState: func(state any) string {
		s := state.(lockState)
		if s.holder == 0 {
			return fmt.Sprintf("free, last token %d", s.last)
		}
		return fmt.Sprintf("held with token %d", s.holder)
	},
}

// counterModel is a register incremented by read-modify-write sections:
// each section read the value Val and wrote Val+1, so it is legal only if
// the register held Val. Each Redis command is atomic by itself, so the
// GET and the SET, recorded apart, would be linearizable even without a
// lock; it is the section as a whole that only the lock makes atomic, and
// so it is the section that is recorded as one operation. Two sections that
// overlapped both read the same value, and no order explains both.
var counterModel = porcupine.Model{
	Init: func() any { return int64(0) },
	Step: func(state, input, _ any) (bool, any) {
		v, in := state.(int64), input.(record)
		if in.Op != opIncr || in.Val != v {
			return false, v
		}
		return true, v + 1
	},
	DescribeOperation: describe,
	DescribeState:     func(state any) string { return fmt.Sprint(state) },
}

// semaphoreModel is a counting semaphore of the given capacity whose state
// is the number of permits in use. Acquire(n) is legal only if in use + n
// <= capacity, so a history with more than capacity permits held at one
// instant (acquires returned, releases not yet called) has no legal order.
// A TryAcquire(n) that failed is legal only if n did not fit.
func semaphoreModel(capacity int64) porcupine.Model {
	return porcupine.Model{
		Init: func() any { return int64(0) },
		Step: func(state, input, _ any) (bool, any) {
			used, in := state.(int64), input.(record)
			switch in.Op {
			case opAcquire:
				if in.Val < 1 || used+in.Val > capacity {
					return false, used
				}
				return true, used + in.Val
			case opRelease:
				if in.Val < 1 || in.Val > used {
					return false, used
				}
				return true, used - in.Val
			case opBusy:
				return used+in.Val > capacity, used
			}
			return false, used
		},
		DescribeOperation: describe,
		DescribeState:     func(state any) string { return fmt.Sprintf("%d/%d in use", state, capacity) },
	}
}

// limiterModel is a rate limiter inside one window (or a bucket that does
// not refill during the test): the state is the cost allowed so far. An
// allowed request is legal only if it fits under limit, and, for exactness,
// a denied one only if it does not fit: a limiter that lets too much
// through fails, and so does one that denies while there is room.
func limiterModel(limit int64) porcupine.Model {
	return porcupine.Model{
		Init: func() any { return int64(0) },
		Step: func(state, input, _ any) (bool, any) {
			used, in := state.(int64), input.(record)
			if in.Op != opAllow {
				return false, used
			}
			fits := used+in.Val <= limit
			if in.OK != fits {
				return false, used
			}
			if in.OK {
				return true, used + in.Val
			}
			return true, used
		},
		DescribeOperation: describe,
		DescribeState:     func(state any) string { return fmt.Sprintf("%d/%d allowed", state, limit) },
	}
}

// describe labels an operation in porcupine's visualization.
func describe(input, _ any) string {
	in := input.(record)
	switch in.Op {
	case opAllow:
		return fmt.Sprintf("allow(%d) -> %t", in.Val, in.OK)
	case opBusy:
		return fmt.Sprintf("try(%d) -> busy", in.Val)
	}
	return fmt.Sprintf("%s(%d)", in.Op, in.Val)
}
