package convert

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// Whatever the number of splits, their fractions and the repositories'
// sizes, every split ends within one split unit (the largest repository) of
// its target, and no repository is cut. Why it holds for the greedy
// (largest unit first, to the split furthest below its target): a split
// only takes a unit while its deficit is the largest, so it overshoots by
// less than that unit; and if a split ended more than the largest unit
// short, every unit that overfilled another split was given while that
// split's deficit was larger still — more than the unit — which cannot
// overfill it; with nothing overfilled the deficits could not sum to zero.
func TestAssignSplitsWithinOneUnit(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for trial := 0; trial < 3000; trial++ {
		k := 2 + r.IntN(4)
		splits := make([]Split, k)
		sum := 0.0
		for i := range splits {
			splits[i] = Split{Name: fmt.Sprintf("s%d", i), Frac: 0.05 + r.Float64()}
			sum += splits[i].Frac
		}
		for i := range splits {
			splits[i].Frac /= sum
		}
		var ids, units []string
		unitSize := map[string]int{}
		largest := 0
		for u := 0; u < 1+r.IntN(40); u++ {
			size := []int{1, 1, 1, 2, 3, 5, 8, 20}[r.IntN(8)]
			name := fmt.Sprintf("repo%d", u)
			unitSize[name] = size
			largest = max(largest, size)
			for j := 0; j < size; j++ {
				ids = append(ids, fmt.Sprintf("%s-%d", name, j))
				units = append(units, name)
			}
		}
		got := assignSplits(ids, units, splits, 0, uint64(trial))
		have := map[string]int{}
		unitIn := map[string]string{}
		for i, id := range ids {
			s := got[id]
			have[s]++
			if prev, ok := unitIn[units[i]]; ok && prev != s {
				t.Fatalf("trial %d: %s is in %s and %s", trial, units[i], prev, s)
			}
			unitIn[units[i]] = s
		}
		for _, s := range splits {
			if dev := math.Abs(float64(have[s.Name]) - s.Frac*float64(len(ids))); dev > float64(largest)+1e-9 {
				t.Fatalf("trial %d: split %s has %d of %d tasks, target %.2f: off by %.2f > largest unit %d",
					trial, s.Name, have[s.Name], len(ids), s.Frac*float64(len(ids)), dev, largest)
			}
		}
	}
}
