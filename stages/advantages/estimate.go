package advantages

import (
	"fmt"
	"math"
)

// Estimator names a group-relative advantage estimator (docs/advantages.md §3).
type Estimator string

// The estimators. All but Raw centre a group's rewards, so their advantages
// are exactly 0 in a uniform group and in a singleton group.
const (
	GRPO              Estimator = "grpo"               // (R − mean) / (std + eps), Bessel-corrected std
	DrGRPO            Estimator = "dr-grpo"            // R − mean
	RLOO              Estimator = "rloo"               // R − mean of the other rollouts
	ReinforceBaseline Estimator = "reinforce-baseline" // R − mean (REINFORCE++-baseline; the trainer whitens)
	Raw               Estimator = "raw"                // R
)

// Estimators lists the estimators in the order --help shows them.
func Estimators() []Estimator { return []Estimator{GRPO, DrGRPO, RLOO, ReinforceBaseline, Raw} }

// ParseEstimator checks an --estimator value.
func ParseEstimator(s string) (Estimator, error) {
	for _, e := range Estimators() {
		if string(e) == s {
			return e, nil
		}
	}
	return "", fmt.Errorf("unknown estimator %q: want one of grpo, dr-grpo, rloo, reinforce-baseline, raw", s)
}

// GroupAdvantages writes into out (len(out) == len(rewards)) the advantage
// of each rollout of one group, given one reward per DISTINCT rollout: the
// caller has already collapsed a rollout's segments to a single outcome
// (docs/advantages.md §3.1). eps is GRPO's std epsilon.
//
// A group of fewer than two rollouts, or whose rewards are all equal, gets
// exactly 0 from every centring estimator: the centred value is 0 and the
// Bessel std is undefined or 0, and computing it in floating point could
// leave a residue such as 1e-17 where "no learning signal" must be exact.
func GroupAdvantages(est Estimator, rewards []float64, eps float64, out []float64) {
	n := len(rewards)
	if est == Raw {
		copy(out, rewards)
		return
	}
	uniform := true
	for _, r := range rewards[min(n, 1):] {
		uniform = uniform && r == rewards[0]
	}
	if n < 2 || uniform {
		clear(out[:n])
		return
	}
	var sum float64
	for _, r := range rewards {
		sum += r
	}
	mean := sum / float64(n)
	switch est {
	case GRPO:
		var ss float64
		for _, r := range rewards {
			d := r - mean
			ss += d * d
		}
		std := math.Sqrt(ss / float64(n-1))
		for i, r := range rewards {
			out[i] = (r - mean) / (std + eps)
		}
	case DrGRPO, ReinforceBaseline:
		for i, r := range rewards {
			out[i] = r - mean
		}
	case RLOO:
		for i, r := range rewards {
			out[i] = r - (sum-r)/float64(n-1)
		}
	default:
		panic("advantages: unknown estimator " + string(est))
	}
}
