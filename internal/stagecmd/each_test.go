package stagecmd

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// Each runs every item once, never more than n at once, and delivers every
// result before it closes the channel.
func TestEach(t *testing.T) {
	items := make([]int, 50)
	for i := range items {
		items[i] = i
	}
	var running, peak atomic.Int32
	sum := 0
	for r := range Each(context.Background(), 3, items, func(i int) int {
		if n := running.Add(1); n > peak.Load() {
			peak.Store(n)
		}
		time.Sleep(time.Millisecond)
		running.Add(-1)
		return i
	}) {
		sum += r
	}
	if sum != 49*50/2 {
		t.Errorf("sum of results %d, want %d", sum, 49*50/2)
	}
	if p := peak.Load(); p > 3 || p < 2 {
		t.Errorf("peak concurrency %d, want 2..3", p)
	}
}

// Once ctx is done Each starts no further item, and still delivers the
// results of those it started.
func TestEachStopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	items := make([]int, 100)
	var started atomic.Int32
	got := 0
	for range Each(ctx, 2, items, func(int) int {
		if started.Add(1) == 4 {
			cancel()
		}
		time.Sleep(time.Millisecond)
		return 0
	}) {
		got++
	}
	if s := started.Load(); s > 6 || int(s) != got {
		t.Errorf("started %d items and received %d results after a cancel at the 4th", s, got)
	}
}
