package train

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// benchLengths are n segment lengths from a realistic agent distribution:
// log-normal around 3k tokens (median e^8 ≈ 2,980, σ 0.8), clipped to
// [64, 32768], so a few exceed a 16k cap.
func benchLengths(n int) []int {
	rng := rand.New(rand.NewPCG(42, 7))
	out := make([]int, n)
	for i := range out {
		l := math.Exp(8 + 0.8*rng.NormFloat64())
		out[i] = int(min(max(l, 64), 32768))
	}
	return out
}

// BenchmarkPack packs 1M segments (10k under -short) into micro-batches of
// at most 16,384 tokens, step by step as the stage does (steps of 256
// segments), with first-fit and first-fit-decreasing, and reports
// segments/s and the micro-batches used beside the optimal lower bound
// Σ ceil(Σlen/cap) per step (oversize segments counted as bins of their
// own): mb_over_bound is the ratio (goal ≤ 1.05).
func BenchmarkPack(b *testing.B) {
	n := 1_000_000
	if testing.Short() {
		n = 10_000
	}
	const limit, perStep = 16384, 256
	lengths := benchLengths(n)
	bound := 0
	for lo := 0; lo < n; lo += perStep {
		sum, over := 0, 0
		for _, l := range lengths[lo:min(lo+perStep, n)] {
			if l > limit {
				over++
			} else {
				sum += l
			}
		}
		bound += over + (sum+limit-1)/limit
	}
	for _, p := range []Packing{FirstFit, FirstFitDecreasing} {
		b.Run(string(p), func(b *testing.B) {
			bins := 0
			var elapsed time.Duration
			for b.Loop() {
				bins = 0
				t0 := time.Now()
				for lo := 0; lo < n; lo += perStep {
					bins += len(Pack(lengths[lo:min(lo+perStep, n)], limit, p))
				}
				elapsed += time.Since(t0)
			}
			b.ReportMetric(float64(n)*float64(b.N)/elapsed.Seconds(), "segments/s")
			b.ReportMetric(float64(bins), "micro_batches")
			b.ReportMetric(float64(bound), "lower_bound")
			b.ReportMetric(float64(bins)/float64(bound), "mb_over_bound")
		})
	}
}
