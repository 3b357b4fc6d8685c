package main

import (
	"testing"
	"time"
)

func TestCovered(t *testing.T) {
	at := func(s int) time.Time { return time.Unix(1000+int64(s), 0) }
	sp := func(a, b int) span { return span{at(a), at(b)} }
	for _, c := range []struct {
		name  string
		spans []span
		want  time.Duration
	}{
		{"none", nil, 0},
		{"one", []span{sp(0, 5)}, 5 * time.Second},
		{"disjoint", []span{sp(10, 12), sp(0, 5)}, 7 * time.Second},
		{"overlapping, unsorted", []span{sp(3, 8), sp(0, 5), sp(7, 9)}, 9 * time.Second},
		{"nested", []span{sp(0, 10), sp(2, 3), sp(4, 6)}, 10 * time.Second},
		{"touching", []span{sp(0, 2), sp(2, 4)}, 4 * time.Second},
		{"a gap after a long one", []span{sp(0, 10), sp(1, 2), sp(12, 13)}, 11 * time.Second},
	} {
		if got := covered(c.spans); got != c.want {
			t.Errorf("%s: covered = %v, want %v", c.name, got, c.want)
		}
	}
}
