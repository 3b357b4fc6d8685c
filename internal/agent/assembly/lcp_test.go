package assembly

import (
	"math/rand/v2"
	"testing"
)

// TestLCP holds the blocked lcp to the element-by-element definition, with
// differences at and around block and sub-block boundaries.
func TestLCP(t *testing.T) {
	naive := func(a, b []int32) int {
		i := 0
		for i < len(a) && i < len(b) && a[i] == b[i] {
			i++
		}
		return i
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 63, 64, 65, 4095, 4096, 4097, 8192, 9000} {
		a := make([]int32, n)
		for i := range a {
			a[i] = r.Int32N(5)
		}
		for _, at := range []int{0, 1, 62, 63, 64, 65, 4095, 4096, 4097, 8191, 8192, 8999, n - 1, r.IntN(n + 1)} {
			for _, m := range []int{n, n / 2, n + 3} {
				b := make([]int32, m)
				copy(b, a)
				for i := n; i < m; i++ {
					b[i] = 7
				}
				if at >= 0 && at < min(n, m) {
					b[at]++
				}
				if got, want := lcp(a, b), naive(a, b); got != want {
					t.Fatalf("n=%d m=%d diff at %d: lcp %d, want %d", n, m, at, got, want)
				}
				if got, want := lcp(b, a), naive(b, a); got != want {
					t.Fatalf("n=%d m=%d diff at %d (swapped): lcp %d, want %d", n, m, at, got, want)
				}
			}
		}
	}
}
