package report

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"html/template"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/kilnrl/kiln/formats/store"
)

//go:embed assets/report.css assets/report.js assets/report.html.tmpl
var assets embed.FS

// DefaultEmbedBytes is the page's cap on embedded rollout views
// (docs/report.md §2): half for each step's best and worst, half for the
// others in step order; the rest are files beside the page.
const DefaultEmbedBytes = 4 << 20

// DefaultLogBytes is how much of a grading log a rollout view shows (its
// head and tail).
const DefaultLogBytes = 64 << 10

// HTMLOptions configure WriteHTML.
type HTMLOptions struct {
	// Out is the page's path; the rollout files go to Out without .html
	// plus "_files".
	Out        string
	EmbedBytes int
	LogBytes   int
	// Now is the time the page says it was written (default: now).
	Now time.Time
}

// FilesDir is the directory beside out that holds the rollouts not
// embedded in the page: one file per step (stepFileName) and the
// stylesheet they share.
func FilesDir(out string) string { return strings.TrimSuffix(out, filepath.Ext(out)) + "_files" }

// stepFileName is the file in FilesDir of a step's rollouts that are not
// in the page.
func stepFileName(step int) string { return fmt.Sprintf("step-%d.html", step) }

// stepFile is what the "stepfile" template renders: a step's rollouts
// that are not in the page, each view shown by :target, an index of them
// on top.
type stepFile struct {
	Step      int
	Back, CSS string
	Rollouts  []fileEntry
	Views     []template.HTML
}

type fileEntry struct {
	R      *Rollout
	Anchor string
}

// stepViews are a step's rendered rollout views, in placing order.
type stepViews struct {
	order []*Rollout
	html  [][]byte
	prio  map[int64]bool
	byID  map[int64]*Rollout
}

// renderStep reads a step's turns and grading logs and renders each of
// its rollouts' views: its best and worst first, then the rest in id
// order.
func renderStep(ctx context.Context, st store.Store, tmpl *template.Template, s *Step, logBytes int) (*stepViews, error) {
	turns, err := readTurns(ctx, s)
	if err != nil {
		return nil, err
	}
	sv := &stepViews{prio: map[int64]bool{}, byID: map[int64]*Rollout{}}
	for _, x := range s.Rollouts {
		sv.byID[x.ID] = x
	}
	for _, id := range append(append([]int64{}, s.Best...), s.Worst...) {
		sv.prio[id] = true
	}
	for _, x := range s.Rollouts {
		if sv.prio[x.ID] {
			sv.order = append(sv.order, x)
		}
	}
	for _, x := range s.Rollouts {
		if !sv.prio[x.ID] {
			sv.order = append(sv.order, x)
		}
	}
	var b bytes.Buffer
	for _, x := range sv.order {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		b.Reset()
		if err := tmpl.ExecuteTemplate(&b, "rollout", view(ctx, st, s, x, turns[x.ID], turns != nil, logBytes)); err != nil {
			return nil, err
		}
		sv.html = append(sv.html, bytes.Clone(b.Bytes()))
	}
	return sv, nil
}

// renderSteps renders the steps with up to GOMAXPROCS workers and hands
// each result to place in step order, as soon as it and those before it
// are done. At most 2×GOMAXPROCS rendered steps wait to be placed, so
// memory stays a few steps' views whatever the run's length. The first
// error stops the rendering and is returned.
func renderSteps(ctx context.Context, steps []*Step, render func(context.Context, *Step) (*stepViews, error), place func(*Step, *stepViews) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n := runtime.GOMAXPROCS(0)
	type result struct {
		sv   *stepViews
		err  error
		held bool // it holds a slot of ahead
	}
	results := make([]chan result, len(steps))
	for i := range results {
		results[i] = make(chan result, 1)
	}
	ahead := make(chan struct{}, 2*n) // steps rendered or rendering, not yet placed
	var g errgroup.Group
	g.SetLimit(n)
	go func() {
		for i, s := range steps {
			select {
			case ahead <- struct{}{}:
			case <-ctx.Done():
				results[i] <- result{err: ctx.Err()}
				continue
			}
			g.Go(func() error {
				sv, err := render(ctx, s)
				results[i] <- result{sv, err, true}
				return nil
			})
		}
	}()
	var first error
	for i, s := range steps {
		res := <-results[i]
		if res.held {
			<-ahead
		}
		if first == nil && res.err == nil {
			res.err = place(s, res.sv)
		}
		if first == nil && res.err != nil {
			first = res.err
			cancel()
		}
	}
	g.Wait()
	return first
}

type pageData struct {
	R          *Report
	Title      string
	Generated  string
	CSS        template.CSS
	JS         template.JS
	Charts     []template.HTML
	Columns    []string
	Rows       []tableRow
	Stages     []string
	Hist       map[int]template.HTML
	Embedded   []template.HTML
	Files      int
	EmbedBytes int
	FilesDir   string
	TaskSteps  []int
	Best       map[int][]*Rollout
	Worst      map[int][]*Rollout
}

type tableRow struct {
	Step  int
	State string
	Cells []string
	Wall  []string
}

// WriteHTML renders r into one self-contained page at o.Out (written
// beside it, then renamed) and the rollouts that do not fit the cap into
// FilesDir(o.Out). It reads each step's turns and grading logs.
func WriteHTML(ctx context.Context, st store.Store, r *Report, o HTMLOptions) error {
	if o.EmbedBytes <= 0 {
		o.EmbedBytes = DefaultEmbedBytes
	}
	if o.LogBytes <= 0 {
		o.LogBytes = DefaultLogBytes
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	css, _ := assets.ReadFile("assets/report.css")
	js, _ := assets.ReadFile("assets/report.js")
	tmpl, err := template.New("report.html.tmpl").Funcs(template.FuncMap{
		"f":     fmtPtr,
		"cell":  matrixCell,
		"wall":  func(s float64) string { return wallString(s) },
		"join":  strings.Join,
		"inc":   func(i int) int { return i + 1 },
		"isSet": func(p *float64) bool { return p != nil },
	}).ParseFS(assets, "assets/report.html.tmpl")
	if err != nil {
		return err
	}
	filesDir := FilesDir(o.Out)
	filesRel := filepath.Base(filesDir)
	tmpFiles := filesDir + ".tmp"
	if err := os.RemoveAll(tmpFiles); err != nil {
		return err
	}
	d := &pageData{R: r, Title: title(r), Generated: o.Now.UTC().Format(time.RFC3339), CSS: template.CSS(css), JS: template.JS(js),
		Stages: stages(r), Hist: map[int]template.HTML{}, EmbedBytes: o.EmbedBytes, FilesDir: filesRel,
		Best: map[int][]*Rollout{}, Worst: map[int][]*Rollout{}}
	for _, c := range charts(r) {
		d.Charts = append(d.Charts, c.svg())
	}
	for _, c := range TableColumns() {
		d.Columns = append(d.Columns, c.Header)
	}
	for _, s := range r.Steps {
		row := tableRow{Step: s.Step, State: s.State}
		for _, c := range TableColumns() {
			v := c.Cell(s.Figures)
			if v == "" {
				v = "-"
			}
			row.Cells = append(row.Cells, v)
		}
		for _, stage := range d.Stages {
			v := "-"
			if sec, ok := s.Wall[stage]; ok && sec > 0 {
				v = wallString(sec)
			}
			row.Wall = append(row.Wall, v)
		}
		d.Rows = append(d.Rows, row)
		d.Hist[s.Step] = histogram(fmt.Sprintf("hist-%d", s.Step), s.Rows.Advantage)
		d.TaskSteps = append(d.TaskSteps, s.Step)
	}

	// The rollout views, rendered a step at a time by up to GOMAXPROCS
	// workers, placed in step order: best and worst of each step first,
	// then the rest, each half of the cap; what does not fit goes to the
	// step's file.
	priorityLeft, restLeft := o.EmbedBytes/2, o.EmbedBytes-o.EmbedBytes/2
	place := func(s *Step, sv *stepViews) error {
		for _, x := range s.Best {
			d.Best[s.Step] = append(d.Best[s.Step], sv.byID[x])
		}
		for _, x := range s.Worst {
			d.Worst[s.Step] = append(d.Worst[s.Step], sv.byID[x])
		}
		file := stepFile{Step: s.Step, CSS: "report.css", Back: "../" + filepath.Base(o.Out) + "#step-" + fmt.Sprint(s.Step)}
		rel := filesRel + "/" + stepFileName(s.Step)
		for i, x := range sv.order {
			b := sv.html[i]
			left := &restLeft
			if sv.prio[x.ID] {
				left = &priorityLeft
				if priorityLeft < len(b) && restLeft >= len(b) {
					left = &restLeft
				}
			}
			if *left >= len(b) {
				*left -= len(b)
				d.Embedded = append(d.Embedded, template.HTML(b))
				x.Page = "#" + anchor(s.Step, x.ID)
				continue
			}
			file.Rollouts = append(file.Rollouts, fileEntry{x, anchor(s.Step, x.ID)})
			file.Views = append(file.Views, template.HTML(b))
			x.Page = rel + "#" + anchor(s.Step, x.ID)
		}
		if len(file.Rollouts) == 0 {
			return nil
		}
		var b bytes.Buffer
		if err := tmpl.ExecuteTemplate(&b, "stepfile", file); err != nil {
			return err
		}
		if err := os.MkdirAll(tmpFiles, 0o755); err != nil {
			return err
		}
		d.Files += len(file.Rollouts)
		return os.WriteFile(filepath.Join(tmpFiles, stepFileName(s.Step)), b.Bytes(), 0o644)
	}
	if err := renderSteps(ctx, r.Steps, func(ctx context.Context, s *Step) (*stepViews, error) {
		return renderStep(ctx, st, tmpl, s, o.LogBytes)
	}, place); err != nil {
		return err
	}
	if d.Files > 0 {
		if err := os.WriteFile(filepath.Join(tmpFiles, "report.css"), css, 0o644); err != nil {
			return err
		}
	}
	var page bytes.Buffer
	if err := tmpl.ExecuteTemplate(&page, "page", d); err != nil {
		return err
	}
	// The files first, then the page that links them.
	if err := os.RemoveAll(filesDir); err != nil {
		return err
	}
	if d.Files > 0 {
		if err := os.Rename(tmpFiles, filesDir); err != nil {
			return err
		}
	}
	tmp := o.Out + ".tmp"
	if err := os.WriteFile(tmp, page.Bytes(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, o.Out)
}

func title(r *Report) string {
	if r.PipelineName != "" {
		return "kiln report: " + r.PipelineName
	}
	return "kiln report: " + strings.Join(r.Refs, " ")
}

func fmtPtr(p *float64, format string) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf(format, *p)
}

// matrixCell is a pass rate's cell: its text and background.
func matrixCell(p *float64) template.HTMLAttr {
	if p == nil {
		return `class="none"`
	}
	// red (0) to green (1)
	hue := 120 * math.Max(0, math.Min(1, *p))
	return template.HTMLAttr(fmt.Sprintf(`style="background:hsl(%.0f,70%%,%.0f%%)" data-pass="%s"`, hue, 80-15**p, FormatValue(*p)))
}

func wallString(sec float64) string {
	d := time.Duration(sec * float64(time.Second))
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	if d < 10*time.Second {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
