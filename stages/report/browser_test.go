package report_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/kilnrl/kiln/internal/stagecmd/stagetest"
	"github.com/kilnrl/kiln/internal/testenv"
	"github.com/kilnrl/kiln/stages/report"
	"github.com/kilnrl/kiln/stages/report/reporttest"
)

// TestBrowser renders a report in headless Chromium (Debian's chromium,
// scripts/install-test-deps.sh) driven over the DevTools protocol, from a
// copy of the page and its files on another path with the original
// removed:
//
//   - no console error, no uncaught exception, no failed request, and no
//     request to anything but file: and data: URLs;
//   - every chart's every data point equals the figure the report's JSON
//     holds for that step, by a mapping written here (chart, series ->
//     JSON field), not by the chart code;
//   - clicking a step's best rollout shows its view: its turns, patch and
//     grading log; following a rollout that is a file beside the page
//     shows that file, styled;
//   - a screenshot is saved ($KILN_REPORT_SCREENSHOT, else the test's
//     directory): docs/report.png is made from it.
//
// Skips without chromium, fails without it under CI=true.
func TestBrowser(t *testing.T) {
	chrome, err := exec.LookPath("chromium")
	if err != nil {
		testenv.SkipOrFail(t, "no chromium on PATH: scripts/install-test-deps.sh installs it")
	}
	st, dir := newStore(t)
	run := reporttest.Write(t, st, reporttest.Options{Steps: 4, Staleness: 1, Samples: 4, Tasks: 5, Turns: 3})
	file := reporttest.Pipeline(t, st, t.TempDir(), "demo", run)
	orig := filepath.Join(t.TempDir(), "a", "report.html")
	if err := os.MkdirAll(filepath.Dir(orig), 0o755); err != nil {
		t.Fatal(err)
	}
	// A cap that embeds some rollouts and leaves the others as files.
	res := stagetest.Run(t, commands, "report", "--store", dir, "--out", orig, "--embed-bytes", "120000", file)
	if res.Code != 0 || res.LastLine() != orig {
		t.Fatalf("kiln report: exit %d, last line %q:\n%s", res.Code, res.LastLine(), res.Stderr)
	}
	r := reportJSON(t, "--store", dir, file)

	// The copy: the page and its files elsewhere, the original gone.
	copyDir := filepath.Join(t.TempDir(), "elsewhere")
	if out, err := exec.Command("cp", "-r", filepath.Dir(orig), copyDir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	if err := os.RemoveAll(filepath.Dir(orig)); err != nil {
		t.Fatal(err)
	}
	page := filepath.Join(copyDir, "report.html")

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chrome), chromedp.NoSandbox,
		chromedp.WindowSize(1300, 900), chromedp.Flag("allow-file-access-from-files", false))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancel = context.WithTimeout(ctx, 90*time.Second)
	defer cancel()

	var mu sync.Mutex
	var problems, requests []string
	chromedp.ListenTarget(ctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.APITypeError || e.Type == runtime.APITypeWarning {
				var args []string
				for _, a := range e.Args {
					args = append(args, string(a.Value))
				}
				problems = append(problems, fmt.Sprintf("console %s: %s", e.Type, strings.Join(args, " ")))
			}
		case *runtime.EventExceptionThrown:
			problems = append(problems, "exception: "+e.ExceptionDetails.Error())
		case *network.EventLoadingFailed:
			problems = append(problems, fmt.Sprintf("request failed: %s %s", e.ErrorText, e.BlockedReason))
		case *network.EventRequestWillBeSent:
			requests = append(requests, e.Request.URL)
		}
	})
	if err := chromedp.Run(ctx, network.Enable(), runtime.Enable(), chromedp.Navigate("file://"+page), chromedp.WaitReady("footer")); err != nil {
		t.Fatalf("loading %s: %v", page, err)
	}

	// Every point of every chart.
	var points []struct {
		Chart, Series string
		Step          int
		Value         string
	}
	if err := chromedp.Run(ctx, chromedp.Evaluate(`Array.from(document.querySelectorAll("circle.pt")).map(c => ({
		Chart: c.dataset.chart, Series: c.dataset.series, Step: +c.dataset.step, Value: c.dataset.value}))`, &points)); err != nil {
		t.Fatal(err)
	}
	want := chartFigures()
	seen := map[string]int{}
	for _, p := range points {
		key := p.Chart + "/" + p.Series
		seen[key]++
		var step *report.Step
		for _, s := range r.Steps {
			if s.Step == p.Step {
				step = s
			}
		}
		if step == nil {
			t.Errorf("chart %s has a point at step %d, which the report lacks", key, p.Step)
			continue
		}
		var w *float64
		if p.Chart == "wall" {
			if v, ok := step.Wall[p.Series]; ok {
				w = &v
			}
		} else if f, ok := want[key]; ok {
			w = f(step)
		} else {
			t.Errorf("chart %s: the test does not know which figure it draws", key)
			continue
		}
		if w == nil || report.FormatValue(*w) != p.Value {
			t.Errorf("chart %s step %d: the page draws %s, the store's figure is %v", key, p.Step, p.Value, deref(w))
		}
	}
	for key := range want {
		if seen[key] != len(r.Steps) {
			t.Errorf("chart %s has %d points, want one per step (%d)", key, seen[key], len(r.Steps))
		}
	}
	if seen["wall/rollout"] != len(r.Steps) {
		t.Errorf("the wall-time chart has %d rollout points, want %d", seen["wall/rollout"], len(r.Steps))
	}

	// The matrix: each cell the report's pass rate.
	var cells []string
	if err := chromedp.Run(ctx, chromedp.Evaluate(`Array.from(document.querySelectorAll("table.matrix tbody td")).map(td => td.dataset.pass || "-")`, &cells)); err != nil {
		t.Fatal(err)
	}
	var wantCells []string
	for _, task := range r.Tasks {
		for _, p := range task.Pass {
			if p == nil {
				wantCells = append(wantCells, "-")
			} else {
				wantCells = append(wantCells, report.FormatValue(*p))
			}
		}
	}
	if strings.Join(cells, " ") != strings.Join(wantCells, " ") {
		t.Errorf("matrix cells %v, want %v", cells, wantCells)
	}

	// The best rollout of step 2, one click away: its turns, patch, log.
	best := r.Steps[1].Best[0]
	anchor := fmt.Sprintf("r-2-%d", best)
	var shown, text string
	if err := chromedp.Run(ctx,
		chromedp.Click(`#step-2 a.best`, chromedp.ByQuery),
		chromedp.WaitVisible("#"+anchor, chromedp.ByQuery),
		chromedp.Evaluate(`getComputedStyle(document.getElementById("`+anchor+`")).display`, &shown),
		chromedp.Text("#"+anchor, &text, chromedp.ByQuery),
	); err != nil {
		t.Fatalf("clicking step 2's best rollout (%s): %v", anchor, err)
	}
	for _, w := range []string{"turn 0", "turn 2", "sampled:", "trained", "bash", "diff --git", "pytest", "Fix the issue"} {
		if !strings.Contains(text, w) {
			t.Errorf("rollout %s's view lacks %q:\n%s", anchor, w, text)
		}
	}
	if shown == "none" {
		t.Errorf("rollout %s's view is not displayed after the click", anchor)
	}
	if err := chromedp.Run(ctx, chromedp.FullScreenshot(new([]byte), 90)); err != nil {
		t.Fatal(err)
	}

	// The screenshot: the top of the page.
	var png []byte
	if err := chromedp.Run(ctx, chromedp.Navigate("file://"+page+"#summary"), chromedp.WaitReady("footer"),
		chromedp.CaptureScreenshot(&png)); err != nil {
		t.Fatal(err)
	}
	shot := os.Getenv("KILN_REPORT_SCREENSHOT")
	if shot == "" {
		shot = filepath.Join(t.TempDir(), "report.png")
	}
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(png))

	// A rollout that is a file beside the page: it opens, styled.
	var fileLink string
	if err := chromedp.Run(ctx, chromedp.Evaluate(`(Array.from(document.querySelectorAll('a.rl')).map(a => a.getAttribute("href")).filter(h => h.startsWith("report_files/"))[0] || "")`, &fileLink)); err != nil {
		t.Fatal(err)
	}
	if fileLink == "" {
		t.Fatal("no rollout is a file beside the page: the cap did not apply")
	}
	// It names its view in the step's file: that view shows, the others
	// in the file do not.
	_, fileAnchor, _ := strings.Cut(fileLink, "#")
	if !strings.HasPrefix(fileAnchor, "r-") {
		t.Fatalf("rollout link %q names no view in its file", fileLink)
	}
	var color, ftext string
	var shownViews int
	if err := chromedp.Run(ctx, chromedp.Navigate("file://"+page), chromedp.WaitReady("footer"),
		chromedp.Evaluate(`document.querySelector('a.rl[href="`+fileLink+`"]').closest("details").open = true`, nil),
		chromedp.Click(`a.rl[href="`+fileLink+`"]`, chromedp.ByQuery),
		chromedp.WaitVisible("#"+fileAnchor, chromedp.ByQuery),
		chromedp.Text("#"+fileAnchor, &ftext, chromedp.ByQuery),
		chromedp.Evaluate(`getComputedStyle(document.querySelector("#`+fileAnchor+` pre.patch")).backgroundColor`, &color),
		chromedp.Evaluate(`Array.from(document.querySelectorAll("article.rollout")).filter(a => getComputedStyle(a).display != "none").length`, &shownViews),
	); err != nil {
		t.Fatalf("following %s: %v", fileLink, err)
	}
	if !strings.Contains(ftext, "turn 0") || !strings.Contains(ftext, "diff --git") {
		t.Errorf("the rollout view %s lacks its turns or patch:\n%s", fileLink, ftext)
	}
	if color != "rgb(15, 23, 42)" {
		t.Errorf("the rollout file %s is not styled (patch background %q): its stylesheet did not load", fileLink, color)
	}
	if shownViews != 1 {
		t.Errorf("following %s shows %d rollout views, want just its own", fileLink, shownViews)
	}

	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Errorf("browser: %s", p)
	}
	for _, u := range requests {
		if !strings.HasPrefix(u, "file://"+copyDir) && !strings.HasPrefix(u, "data:") {
			t.Errorf("a request left the copy's file:// directory: %s", u)
		}
	}
	if len(requests) < 3 {
		t.Errorf("only %d requests seen (%v): is the network listener working?", len(requests), requests)
	}
	b, _ := json.Marshal(requests)
	t.Logf("requests: %s", b)
}

// chartFigures maps each chart series the page draws (CHART/SERIES, the
// tracker tags before spaces become underscores) to the JSON figure it
// must equal, written here and not by the chart code; the wall-time chart
// is each stage's Wall.
func chartFigures() map[string]func(*report.Step) *float64 {
	return map[string]func(*report.Step) *float64{
		"pass/pass rate":                func(s *report.Step) *float64 { return s.Figures.PassRate },
		"pass/mean reward":              func(s *report.Step) *float64 { return s.Figures.MeanReward },
		"pass/pass@1":                   func(s *report.Step) *float64 { return s.Figures.PassAt1 },
		"pass/pass@k":                   func(s *report.Step) *float64 { v := s.Figures.PassAtK["4"]; return &v },
		"groups/groups":                 func(s *report.Step) *float64 { return s.Figures.Groups },
		"groups/mixed groups":           func(s *report.Step) *float64 { return s.Figures.MixedGroups },
		"groups/group size":             func(s *report.Step) *float64 { return s.Figures.GroupSize },
		"advantage/min":                 func(s *report.Step) *float64 { return &s.Rows.Advantage.Min },
		"advantage/mean":                func(s *report.Step) *float64 { return &s.Rows.Advantage.Mean },
		"advantage/max":                 func(s *report.Step) *float64 { return &s.Rows.Advantage.Max },
		"advantage/std":                 func(s *report.Step) *float64 { return &s.Rows.Advantage.Std },
		"tokens/prompt":                 func(s *report.Step) *float64 { return s.Rows.PromptTokens },
		"tokens/response":               func(s *report.Step) *float64 { return s.Rows.ResponseTokens },
		"tokens/trained":                func(s *report.Step) *float64 { return s.Figures.TrainedTokens },
		"segments/segments per rollout": func(s *report.Step) *float64 { return s.Rows.SegmentsPerRollout },
		"aborts/rollouts":               func(s *report.Step) *float64 { return s.Figures.Rollouts },
		"aborts/aborted":                func(s *report.Step) *float64 { return s.Figures.Aborted },
		"loss/loss":                     func(s *report.Step) *float64 { return s.Figures.Loss },
		"clipfrac/pg_clipfrac":          func(s *report.Step) *float64 { return s.Figures.ClipFrac },
		"logprob/logprob diff":          func(s *report.Step) *float64 { return s.Figures.LogprobDiff },
		"gradnorm/grad_norm":            func(s *report.Step) *float64 { return s.Figures.GradNorm },
		"kl/ppo_kl":                     func(s *report.Step) *float64 { return s.Figures.PPOKL },
		"kl/kl_loss":                    func(s *report.Step) *float64 { return s.Figures.KLLoss },
		"weights/weights number":        func(s *report.Step) *float64 { return s.Figures.WeightsNumber },
		"weights/staleness":             func(s *report.Step) *float64 { return s.Staleness },
	}
}
