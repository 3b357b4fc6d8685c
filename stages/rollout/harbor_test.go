package rollout

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/internal/stagecmd/stagetest"
	"github.com/kilnrl/kiln/stages/grade"
)

// searchCommand searches the agent's whole filesystem for the marker the
// Harbor fixtures put in their tests/ (KILN-HARBOR-HIDDEN-MARKER), writing
// every file holding it, then "end", into agent-search.txt in the workdir.
// The marker is assembled at run time, so the command's own text (in the
// agent's transcript) does not hold it.
const searchCommand = `P=KILN-HARBOR-HIDDEN; (grep -rIl --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev "$P-MARKER" / 2>/dev/null; echo end) > agent-search.txt`

// TestHarborTestsNeverReachTheAgent runs the shell agent on the Harbor
// fixtures with prebuilt images: an agent searching the whole filesystem
// for the marker placed in tests/ (and solution/ is beside it, also an
// attachment) finds nothing during its run; its rollouts are graded like
// any other task's (the verifier runs, after the run, in a fresh sandbox).
func TestHarborTestsNeverReachTheAgent(t *testing.T) {
	w := newRunWorld(t)
	fixturesDir, err := filepath.Abs(filepath.Join("..", "..", "fixtures", "harbor"))
	require.NoError(t, err)
	r := stagetest.Run(t, stageCommands, "harbor", "--store", w.storeDir, "--out", "tasks/harbor",
		filepath.Join(fixturesDir, "slugify-prebuilt"), filepath.Join(fixturesDir, "calc-fraction"))
	require.Equal(t, 0, r.Code, r.Stderr)
	tasks := r.LastLine()
	r = stagetest.Run(t, stageCommands, "import", "--store", w.storeDir, "--tasks", tasks, "--bundles", w.bundles,
		"--source", w.set.Repository+"=oci:"+w.set.Layout, "--out", "images/harbor")
	require.Equal(t, 0, r.Code, r.Stderr)
	imgs := r.LastLine()

	url := startEngine(t, func(r enginetest.Request) enginetest.Output {
		if r.SessionID == "" {
			return enginetest.Output{Text: "ok"}
		}
		if r.Turn == 0 {
			return enginetest.Output{Text: toolCall("bash", "command", searchCommand)}
		}
		return enginetest.Output{Text: finalAnswer}
	})
	o := w.options(url)
	o.Tasks, o.Images, o.Samples = tasks, imgs, 1
	res, err, logs := w.run(t, context.Background(), "rollout/harbor", o, nil)
	require.NoError(t, err, logs)
	rows := readRollouts(t, w.st, res.Rollouts.Ref)
	require.Len(t, rows, 2)
	for _, row := range rows {
		require.Nil(t, row.AbortReason, "%s: %s\n%s", row.TaskID, deref(row.AbortReason), logs)
		// The search ran to its end and found no file.
		assert.Contains(t, row.Patch, "+++ b/agent-search.txt", row.TaskID)
		assert.Contains(t, row.Patch, "@@ -0,0 +1 @@\n+end\n", "%s: the agent found the hidden tests:\n%s", row.TaskID, row.Patch)
	}

	var gout, gerr bytes.Buffer
	genv := &stagecmd.Env{Stdout: &gout, Stderr: &gerr, Log: stagecmd.NewLogger(&gerr, false)}
	gres, err := grade.Run(context.Background(), genv, w.st, stagecmd.Output{Name: "grades/harbor"},
		grade.Options{Tasks: tasks, Images: imgs, Bundles: w.bundles, Rollouts: res.Rollouts.Ref.String(), Jobs: 2, Timeout: 2 * time.Minute})
	require.NoError(t, err, gerr.String())
	v, err := dataset.Open(context.Background(), w.st, gres.Ref)
	require.NoError(t, err)
	graded := 0
	require.NoError(t, v.EachShard(context.Background(), func(_ int, data []byte) error {
		return records.EachGrade(data, func(g records.Grade) error {
			graded++
			require.NotNil(t, g.GradingKind)
			assert.Equal(t, "harbor", *g.GradingKind)
			assert.Equal(t, 0.0, g.Reward)
			assert.Equal(t, records.FailureTestsFailed, g.Failure, "%s: %s", g.TaskID, deref(g.Error))
			assert.True(t, strings.HasPrefix(deref(g.ApplyMethod), "git_apply"), deref(g.ApplyMethod))
			return nil
		})
	}))
	assert.Equal(t, 2, graded)
}
