package advantages

import "fmt"

// SummaryLines are kiln-advantages' end-of-run report, printed on stderr:
// the groups with signal (a non-zero advantage: mixed rewards under a
// group baseline) against those without (every advantage 0), and a
// warning line when no written row has a non-zero advantage, which a
// trainer can learn nothing from.
func (r *Result) SummaryLines() []string {
	signal, flat, dropped := 0, 0, 0
	for _, g := range r.Groups {
		switch {
		case g.Dropped != "":
			dropped++
		case g.ZeroAdvantage:
			flat++
		default:
			signal++
		}
	}
	lines := []string{fmt.Sprintf("advantages: %d groups: %d with signal (mixed rewards), %d without (every advantage 0), %d dropped; %d rows",
		len(r.Groups), signal, flat, dropped, len(r.Rows))}
	if r.AllZero() {
		lines = append(lines, "advantages: WARNING: every advantage is 0: training on these rows teaches nothing (every group's rollouts got the same reward?)")
	}
	return lines
}

// AllZero reports whether rows were written and none has a non-zero
// advantage.
func (r *Result) AllZero() bool {
	for _, a := range r.Rows {
		if a.Advantage != 0 {
			return false
		}
	}
	return len(r.Rows) > 0
}
