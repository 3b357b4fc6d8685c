package rollout

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/fixtures"
	"github.com/kilnrl/kiln/internal/sandbox"
)

// floodCommand is a hostile agent's tool call: it raises its own
// open-files limit as far as it may and opens connections to its model
// endpoint, each sending half a request head and held open, far past any
// share a sandbox gets; then it waits.
var floodCommand = fmt.Sprintf(`python3 -c '
import resource, socket, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held = []
for i in range(3000):
    try:
        c = socket.create_connection(("127.0.0.1", %d), timeout=2)
        c.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: kiln\r\n")
        held.append(c)
    except OSError:
        pass
time.sleep(60)
'`, sandbox.DefaultEndpointPort)

// TestRunEndpointFlood is issue 31's flooding agent: among the eight runs
// of a stage (-j 3), one agent opens thousands of half-open connections to
// its endpoint. The stage's open-files limit starts low (soft 512, as a
// login shell's might be; the hard limit is left), so without a share per
// sandbox the flood takes every descriptor, the engine's health check
// fails for want of one and the whole stage exits 1. It must instead
// finish the other seven runs and record the flooder's as an abort saying
// why.
func TestRunEndpointFlood(t *testing.T) {
	w := newRunWorld(t)
	var lim syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	t.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim) })
	if lim.Max < 4096 {
		t.Skipf("the hard open-files limit (%d) is too low to flood past a soft one of 512", lim.Max)
	}
	low := lim
	low.Cur = 512
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low))

	flooder := w.set.Tasks[0].ID
	model := newScriptedModel(w.set, func(task fixtures.Task, nth int) behaviour {
		if task.ID == flooder && nth == 0 {
			return flood
		}
		return lookAround
	})
	o := w.options(startEngine(t, model.script))
	o.Samples, o.Jobs = 2, 3
	o.HealthInterval = 300 * time.Millisecond
	o.Budget = 90 * time.Second
	start := time.Now()
	res, err, logs := w.run(t, context.Background(), "rollout/flood", o, nil)
	require.NoError(t, err, logs)
	assert.Less(t, time.Since(start), 3*time.Minute, "the flooder's run is stopped, not left to its budget")
	rows := readRollouts(t, w.st, res.Rollouts.Ref)
	require.Len(t, rows, 2*len(w.set.Tasks), logs)
	aborted := 0
	for _, r := range rows {
		if r.AbortReason == nil {
			assert.Positive(t, r.Turns, r.TaskID)
			continue
		}
		aborted++
		assert.Equal(t, flooder, r.TaskID, "only the flooder's run aborts: %s", *r.AbortReason)
		assert.Equal(t, AbortEndpointFlood, *r.AbortReason)
		require.NotNil(t, r.AbortDetail)
		assert.Contains(t, *r.AbortDetail, "connections to its model endpoint at once")
	}
	assert.Equal(t, 1, aborted, "the flooder's run, and only it, is an abort:\n%s", logs)
	assert.NotContains(t, logs, "failed its health check", "no engine was taken out")
}
