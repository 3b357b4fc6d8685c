package convert

import (
	"math/rand/v2"
	"sort"
)

// assignSplits decides which tasks are kept and in which split. ids and
// unitOf are parallel, in input order; a unit is the repository, else the
// task itself, and a unit's tasks always share a split.
//
// Splits: the units, in a seeded shuffle, are taken largest first and each
// goes to the split furthest below its target (fraction × total tasks), so
// no split ends more than one unit above its target, and with two splits
// none ends more than one unit below (with more, greedy placement keeps
// them close; the tests check within one unit). Without splits every task
// is in the one unnamed split "".
//
// Limit: within each split, units in seeded order take turns giving one task
// each (their tasks also in seeded order) until limit tasks are taken, so a
// sample spreads across repositories. The result maps every kept task id to
// its split; a task not in it is left out.
func assignSplits(ids, unitOf []string, splits []Split, limit int, seed uint64) map[string]string {
	rng := rand.New(rand.NewPCG(seed, 0x6b696c6e636f6e76)) // "kilnconv"
	members := map[string][]string{}
	var units []string
	for i, id := range ids {
		u := unitOf[i]
		if _, ok := members[u]; !ok {
			units = append(units, u)
		}
		members[u] = append(members[u], id)
	}
	sort.Strings(units)
	rng.Shuffle(len(units), func(i, j int) { units[i], units[j] = units[j], units[i] })

	unitSplit := map[string]string{}
	if len(splits) > 0 {
		bySize := append([]string(nil), units...)
		sort.SliceStable(bySize, func(i, j int) bool { return len(members[bySize[i]]) > len(members[bySize[j]]) })
		total := float64(len(ids))
		have := make([]float64, len(splits))
		for _, u := range bySize {
			best := 0
			for k := range splits {
				if splits[k].Frac*total-have[k] > splits[best].Frac*total-have[best] {
					best = k
				}
			}
			have[best] += float64(len(members[u]))
			unitSplit[u] = splits[best].Name
		}
	}

	out := map[string]string{}
	if limit <= 0 {
		for _, u := range units {
			for _, id := range members[u] {
				out[id] = unitSplit[u]
			}
		}
		return out
	}
	// Per split, its units in the seeded order.
	splitUnits := map[string][]string{}
	var names []string
	for _, u := range units {
		s := unitSplit[u]
		if _, ok := splitUnits[s]; !ok {
			names = append(names, s)
		}
		splitUnits[s] = append(splitUnits[s], u)
	}
	order := map[string][]string{}
	for _, u := range units {
		m := append([]string(nil), members[u]...)
		rng.Shuffle(len(m), func(i, j int) { m[i], m[j] = m[j], m[i] })
		order[u] = m
	}
	for _, s := range names {
		taken := 0
		for round := 0; taken < limit; round++ {
			progress := false
			for _, u := range splitUnits[s] {
				if taken == limit {
					break
				}
				if round < len(order[u]) {
					out[order[u][round]] = s
					taken++
					progress = true
				}
			}
			if !progress {
				break
			}
		}
	}
	return out
}
