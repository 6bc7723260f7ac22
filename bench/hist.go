package main

import (
	"math/bits"
	"time"
)

// histogram counts latencies in log-linear buckets: 32 buckets per power of
// two, so a reported percentile is within about 3% of the true value. It has
// a fixed size and recording never allocates, which keeps the harness out of
// the allocations-per-operation figure. Each measuring goroutine owns one;
// they are merged after the goroutines have stopped.
type histogram struct {
	counts [histBuckets]uint64
	n      uint64
}

const (
	subBits     = 5 // 1<<subBits buckets per power of two
	histBuckets = 40<<subBits + 1<<(subBits+1)
)

// bucketOf maps a duration in nanoseconds to its bucket. Values below
// 2<<subBits ns get one bucket each; above, a value keeps its top subBits+1
// bits and the shift says which power of two it is in.
func bucketOf(ns uint64) int {
	n := bits.Len64(ns)
	if n <= subBits+1 {
		return int(ns)
	}
	shift := n - (subBits + 1)
	i := shift<<subBits + int(ns>>shift)
	if i >= histBuckets {
		return histBuckets - 1
	}
	return i
}

// bucketMid is the middle of bucket i, the value a percentile reports.
func bucketMid(i int) uint64 {
	if i < 2<<subBits {
		return uint64(i)
	}
	shift := i>>subBits - 1
	top := uint64(i - shift<<subBits)
	return top<<shift + (1<<shift)/2
}

func (h *histogram) record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.counts[bucketOf(uint64(d))]++
	h.n++
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
}

// quantile returns the latency below which a fraction q of the samples lie,
// or 0 for an empty histogram.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n-1)) + 1
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return time.Duration(bucketMid(i))
		}
	}
	return time.Duration(bucketMid(histBuckets - 1))
}
