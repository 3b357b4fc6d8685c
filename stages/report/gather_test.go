package report_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/kilncmd"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/internal/stagecmd/stagetest"
	"github.com/kilnrl/kiln/stages/report"
	"github.com/kilnrl/kiln/stages/report/reporttest"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

func newStore(t *testing.T) (store.Store, string) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return st, dir
}

func commands(env *stagecmd.Env) []*cli.Command { return []*cli.Command{report.Command(env)} }

// kiln runs the whole kiln app in-process (kiln status beside kiln report).
func kiln(t *testing.T, args ...string) stagetest.Result {
	t.Helper()
	var out, errb bytes.Buffer
	env := &stagecmd.Env{Stdout: &out, Stderr: &errb, Log: stagecmd.NewLogger(&errb, false)}
	code := stagecmd.Main(kilncmd.App(env), append([]string{"kiln"}, args...), &errb)
	return stagetest.Result{Stdout: out.String(), Stderr: errb.String(), Code: code}
}

func reportJSON(t *testing.T, args ...string) *report.Report {
	t.Helper()
	res := stagetest.Run(t, commands, append([]string{"report", "--json"}, args...)...)
	if res.Code != 0 {
		t.Fatalf("kiln report --json %s: exit %d\n%s", strings.Join(args, " "), res.Code, res.Stderr)
	}
	var r report.Report
	if err := json.Unmarshal([]byte(res.Stdout), &r); err != nil {
		t.Fatalf("kiln report --json: %v\n%s", err, res.Stdout)
	}
	return &r
}

// TestJSONGolden: kiln report --json of three steps given as refs (the
// checkpoints; each step's other datasets found through the lineage) is
// the golden data: figures, row figures, rollouts, the matrix, lineage.
// Refs, not a pipeline, so no wall time makes it vary.
func TestJSONGolden(t *testing.T) {
	st, dir := newStore(t)
	run := reporttest.Write(t, st, reporttest.Options{Staleness: 1})
	var refs []string
	for _, s := range run.Steps {
		refs = append(refs, s.Checkpoints.String())
	}
	res := stagetest.Run(t, commands, append([]string{"report", "--store", dir, "--json"}, refs...)...)
	if res.Code != 0 {
		t.Fatalf("exit %d: %s", res.Code, res.Stderr)
	}
	got := strings.ReplaceAll(res.Stdout, st.URI(), "STORE")
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, []byte(got), "", " "); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "refs.golden.json")
	if *update {
		if err := os.WriteFile(golden, pretty.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if pretty.String() != string(want) {
		t.Errorf("kiln report --json differs from %s (go test -run TestJSONGolden -update rewrites it; read the diff):\n%s", golden, pretty.String())
	}
}

// TestFiguresFromTheStore checks the data against the rows and manifests
// read directly: each step's pass rate is its grades' reward-1 fraction,
// its mean reward their mean over the gradeable (not aborted) ones, its
// loss the mean of the checkpoint manifest's step_metrics loss, its
// tokens the rollouts' sums, the staleness the generator's, best and
// worst the highest and lowest advantages, the matrix each task's
// reward-1 fraction, and the lineage reaches the tasks and the base
// model.
func TestFiguresFromTheStore(t *testing.T) {
	ctx := context.Background()
	st, dir := newStore(t)
	run := reporttest.Write(t, st, reporttest.Options{Steps: 4, Staleness: 1})
	file := reporttest.Pipeline(t, st, t.TempDir(), "rep", run)
	r := reportJSON(t, "--store", dir, file)
	if len(r.Steps) != 4 {
		t.Fatalf("%d steps, want 4", len(r.Steps))
	}
	for i, s := range r.Steps {
		want := run.Steps[i]
		var rewards []float64
		var passed, graded, gradeable, sumR float64
		perTask := map[string][2]float64{}
		eachGrade(t, st, want.Grades, func(g records.Grade) {
			graded++
			passed += g.Reward
			if g.Failure != records.FailureAborted {
				gradeable++
				sumR += g.Reward
			}
			rewards = append(rewards, g.Reward)
			pt := perTask[g.TaskID]
			perTask[g.TaskID] = [2]float64{pt[0] + g.Reward, pt[1] + 1}
		})
		check := func(name string, got *float64, want float64) {
			t.Helper()
			if got == nil || abs(*got-want) > 1e-12 {
				t.Errorf("step %d: %s = %v, want %v", s.Step, name, deref(got), want)
			}
		}
		check("pass_rate", s.Figures.PassRate, passed/graded)
		check("mean_reward", s.Figures.MeanReward, sumR/gradeable)
		cv, err := dataset.Open(ctx, st, want.Checkpoints)
		if err != nil {
			t.Fatal(err)
		}
		loss := cv.Metrics["step_metrics"].(map[string]any)["loss"].([]any)
		check("loss", s.Figures.Loss, (loss[0].(float64)+loss[1].(float64))/2)
		var prompt, output float64
		eachRollout(t, st, want.Rollouts, func(ro records.Rollout) {
			prompt += float64(ro.PromptTokens)
			output += float64(ro.OutputTokens)
		})
		check("prompt_tokens", s.Rows.PromptTokens, prompt)
		check("response_tokens", s.Rows.ResponseTokens, output)
		check("weights_number", s.Figures.WeightsNumber, float64(i+1))
		wantStale := 1.0
		if i == 0 {
			wantStale = 0 // the base model on both sides
		}
		check("staleness", s.Staleness, wantStale)
		if s.Wall["rollout"] <= 0 || s.Wall["train"] <= 0 {
			t.Errorf("step %d: no wall time per stage: %v", s.Step, s.Wall)
		}
		// Best and worst by advantage.
		adv := map[int64]float64{}
		for _, x := range s.Rollouts {
			if x.Advantage != nil {
				adv[x.ID] = *x.Advantage
			}
		}
		if len(s.Best) == 0 || len(s.Worst) == 0 {
			t.Fatalf("step %d: no best or worst rollouts", s.Step)
		}
		for _, x := range s.Rollouts {
			if a, ok := adv[x.ID]; ok && (a > adv[s.Best[0]] || a < adv[s.Worst[0]]) {
				t.Errorf("step %d: rollout %d's advantage %v is outside best %v and worst %v", s.Step, x.ID, a, adv[s.Best[0]], adv[s.Worst[0]])
			}
		}
		for _, task := range r.Tasks {
			pt := perTask[task.TaskID]
			check("matrix "+task.TaskID, task.Pass[i], pt[0]/pt[1])
		}
	}
	if *r.LatestWeights != 4 {
		t.Errorf("latest weights number %v, want 4", *r.LatestWeights)
	}
	var lin []string
	for _, n := range r.Lineage {
		lin = append(lin, n.Ref+" "+strings.Join(n.External, ","))
	}
	all := strings.Join(lin, "\n")
	for _, want := range []string{run.Tasks.String(), run.Steps[0].Checkpoints.String(), reporttest.BaseModel, run.Steps[3].Advantages.String()} {
		if !strings.Contains(all, want) {
			t.Errorf("the lineage does not reach %s:\n%s", want, all)
		}
	}
}

// TestStatusTableAgrees: kiln status --table prints, for every step and
// column, what the report's figures hold (one code computes both).
func TestStatusTableAgrees(t *testing.T) {
	st, dir := newStore(t)
	run := reporttest.Write(t, st, reporttest.Options{})
	file := reporttest.Pipeline(t, st, t.TempDir(), "rep", run)
	r := reportJSON(t, "--store", dir, file)
	res := kiln(t, "--store", dir, "status", file, "--table")
	if res.Code != 0 {
		t.Fatalf("kiln status --table: exit %d\n%s", res.Code, res.Stderr)
	}
	lines := strings.Split(res.Stdout, "\n")
	head := strings.Fields(lines[0])
	for i, s := range r.Steps {
		cells := strings.Fields(lines[i+1])
		for j, c := range report.TableColumns() {
			want := c.Cell(s.Figures)
			if want == "" {
				want = "-"
			}
			if cells[j+2] != want || head[j+2] != c.Header {
				t.Errorf("step %d: the table's %s is %q, the report's %q", s.Step, head[j+2], cells[j+2], want)
			}
		}
	}
	// And the figures themselves: step 1's pass rate as the report says.
	if !strings.Contains(lines[1], strings.TrimRight(report.TableColumns()[0].Cell(r.Steps[0].Figures), "0")) {
		t.Errorf("step 1's row %q lacks the pass rate", lines[1])
	}
}

// TestBadInput: a ref that is not a run's output and a pipeline with no
// step done are exit 5 naming the input; a ref that names nothing is exit
// 3; no page is written.
func TestBadInput(t *testing.T) {
	st, dir := newStore(t)
	run := reporttest.Write(t, st, reporttest.Options{Steps: 1})
	spec := filepath.Join(t.TempDir(), "none.kiln")
	if err := os.WriteFile(spec, []byte("rollout/$(step): [out=x/rollout]\n\tfalse\nSTEPS = 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "r.html")
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{run.Tasks.String()}, stagecmd.ExitBadInput, `"` + run.Tasks.String() + `" holds tasks records: not a run's output`},
		{[]string{spec}, stagecmd.ExitBadInput, `no step of pipeline "none" has a done target yet`},
		{[]string{"run/grades/step-9"}, stagecmd.ExitNotFound, `"run/grades/step-9"`},
		{[]string{}, stagecmd.ExitUsage, "give a PIPELINE.kiln or refs"},
	} {
		res := stagetest.Run(t, commands, append([]string{"report", "--store", dir, "--out", out}, c.args...)...)
		if res.Code != c.code || !strings.Contains(res.Stderr, c.want) {
			t.Errorf("kiln report %v: exit %d, want %d with %q:\n%s", c.args, res.Code, c.code, c.want, res.Stderr)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("kiln report %v wrote a page", c.args)
		}
	}
}

// TestForgotten: a step output no longer in the store and grading logs
// whose attachments were removed are said in the page (and the JSON's
// notes), which is still written whole.
func TestForgotten(t *testing.T) {
	ctx := context.Background()
	st, dir := newStore(t)
	run := reporttest.Write(t, st, reporttest.Options{Steps: 2})
	file := reporttest.Pipeline(t, st, t.TempDir(), "rep", run)
	// Step 2's logs and step 1's turns go.
	var logs []string
	eachGrade(t, st, run.Steps[1].Grades, func(g records.Grade) { logs = append(logs, *g.Log) })
	for _, k := range logs {
		if err := st.Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	if err := dataset.Drop(ctx, st, run.Steps[0].Turns.Name); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "r.html")
	res := stagetest.Run(t, commands, "report", "--store", dir, "--out", out, file)
	if res.Code != 0 {
		t.Fatalf("exit %d: %s", res.Code, res.Stderr)
	}
	if res.LastLine() != out {
		t.Errorf("last stdout line %q, want the page's path %q", res.LastLine(), out)
	}
	page, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"step 1: rollout/1&#39;s output " + run.Steps[0].Turns.String() + " is not in the store (forgotten?)",
		"the step has no turns version: the conversation cannot be shown",
		"the grading log &#34;" + logs[0] + "&#34; is not in the store",
		"</html>",
	} {
		if !strings.Contains(string(page), want) {
			t.Errorf("the page lacks %q", want)
		}
	}
}

func eachGrade(t *testing.T, st store.Store, ref dataset.Ref, fn func(records.Grade)) {
	t.Helper()
	v, err := dataset.Open(context.Background(), st, ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.EachShard(context.Background(), func(_ int, data []byte) error {
		return records.EachGrade(data, func(g records.Grade) error { fn(g); return nil })
	}); err != nil {
		t.Fatal(err)
	}
}

func eachRollout(t *testing.T, st store.Store, ref dataset.Ref, fn func(records.Rollout)) {
	t.Helper()
	v, err := dataset.Open(context.Background(), st, ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.EachShard(context.Background(), func(_ int, data []byte) error {
		return records.EachRollout(data, func(r records.Rollout) error { fn(r); return nil })
	}); err != nil {
		t.Fatal(err)
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

// TestJSONPages: kiln report --json alone writes no page and its
// rollouts have no "page"; with --out it writes the page and its step
// files, the JSON's "page" is the page's path, and every rollout's "page"
// is where its view is: "#r-STEP-ID" an article of the page, else
// OUT_files/step-K.html#r-STEP-ID, an article of that file; the page
// links each rollout by that same address. The cap leaves some of each.
func TestJSONPages(t *testing.T) {
	st, dir := newStore(t)
	run := reporttest.Write(t, st, reporttest.Options{Steps: 2, Tasks: 3, Samples: 4, Turns: 2})
	refs := []string{run.Steps[0].Checkpoints.String(), run.Steps[1].Checkpoints.String()}
	cwd := t.TempDir()
	t.Chdir(cwd)

	r := reportJSON(t, append([]string{"--store", dir}, refs...)...)
	if r.Page != "" {
		t.Errorf("--json without --out: page %q, want none", r.Page)
	}
	for _, s := range r.Steps {
		for _, x := range s.Rollouts {
			if x.Page != "" {
				t.Errorf("--json without --out: rollout %d has page %q", x.ID, x.Page)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(cwd, "report.html")); err == nil {
		t.Error("--json without --out wrote report.html")
	}

	out := filepath.Join(t.TempDir(), "run.html")
	r = reportJSON(t, append([]string{"--store", dir, "--out", out, "--embed-bytes", "60000"}, refs...)...)
	if r.Page != out {
		t.Errorf("page %q, want %q", r.Page, out)
	}
	page, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var inPage, inFiles int
	for _, s := range r.Steps {
		for _, x := range s.Rollouts {
			id := fmt.Sprintf("r-%d-%d", s.Step, x.ID)
			file, frag, _ := strings.Cut(x.Page, "#")
			if frag != id {
				t.Errorf("rollout %d of step %d: page %q does not name its view %s", x.ID, s.Step, x.Page, id)
				continue
			}
			holder := page
			if file == "" {
				inPage++
			} else {
				inFiles++
				if want := "run_files/step-" + fmt.Sprint(s.Step) + ".html"; file != want {
					t.Errorf("rollout %d: file %q, want %q", x.ID, file, want)
				}
				if holder, err = os.ReadFile(filepath.Join(filepath.Dir(out), file)); err != nil {
					t.Errorf("rollout %d: %v", x.ID, err)
					continue
				}
			}
			if !bytes.Contains(holder, []byte(`<article class="rollout" id="`+id+`"`)) {
				t.Errorf("rollout %d: %s has no view %s", x.ID, x.Page, id)
			}
			if !bytes.Contains(page, []byte(`href="`+x.Page+`"`)) {
				t.Errorf("rollout %d: the page does not link %s", x.ID, x.Page)
			}
		}
	}
	if inPage == 0 || inFiles == 0 {
		t.Errorf("%d views in the page, %d in files: the cap should leave some of each", inPage, inFiles)
	}
}
