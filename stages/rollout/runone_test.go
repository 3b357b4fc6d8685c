package rollout

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// crashCause is the agent_crash detail's reading of the exit status
// (docs/rollout.md §2.4).
func TestCrashCause(t *testing.T) {
	cases := []struct {
		code int
		want string
	}{
		{126, "not executable"},
		{127, "command not found"},
		{137, "killed by signal 9, killed"},
		{139, "killed by signal 11, segmentation fault"},
		{128, "not runnable, or killed by a signal"},
		{255, "not runnable, or killed by a signal"},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, crashCause(c.code), "exit %d", c.code)
	}
}
