package rollout

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestLiveStatusBar pins the live fields the terminal bar ends with
// (docs/rollout.md §2.7).
func TestLiveStatusBar(t *testing.T) {
	cases := []struct {
		name string
		s    liveStatus
		want string
	}{
		{"start", liveStatus{}, "running 0, aborted 0, 0.00 turns/s, 0 tokens/s"},
		{"running, nothing finished", liveStatus{running: 32, elapsed: 5 * time.Second}, "running 32, aborted 0, 0.00 turns/s, 0 tokens/s"},
		{"some finished", liveStatus{running: 8, aborted: 1, turns: 96, tokens: 36120, elapsed: 30 * time.Second},
			"running 8, aborted 1, 3.20 turns/s, 1204 tokens/s"},
		{"all finished", liveStatus{aborted: 3, turns: 3200, tokens: 1_000_000, elapsed: 10 * time.Minute},
			"running 0, aborted 3, 5.33 turns/s, 1667 tokens/s"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, c.s.bar())
		})
	}
}
