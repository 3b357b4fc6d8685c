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
	"strings"
	"time"

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
// embedded in the page.
func FilesDir(out string) string { return strings.TrimSuffix(out, filepath.Ext(out)) + "_files" }

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

	// The rollout views: best and worst of each step first, then the
	// rest, each half of the cap; what does not fit is a file.
	priorityLeft, restLeft := o.EmbedBytes/2, o.EmbedBytes-o.EmbedBytes/2
	writeFile := func(v rolloutView) (string, error) {
		rel := filepath.ToSlash(filepath.Join("rollouts", fmt.Sprintf("step-%d", v.Step), fmt.Sprintf("%d.html", v.R.ID)))
		v.Back = "../../../" + filepath.Base(o.Out) + "#" + v.Anchor
		v.CSS = "../../report.css"
		var b bytes.Buffer
		if err := tmpl.ExecuteTemplate(&b, "rolloutpage", v); err != nil {
			return "", err
		}
		p := filepath.Join(tmpFiles, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		d.Files++
		return filesRel + "/" + rel, os.WriteFile(p, b.Bytes(), 0o644)
	}
	for _, s := range r.Steps {
		turns, err := readTurns(ctx, s)
		if err != nil {
			return err
		}
		byID := map[int64]*Rollout{}
		for _, x := range s.Rollouts {
			byID[x.ID] = x
		}
		prio := map[int64]bool{}
		for _, id := range s.Best {
			prio[id] = true
			d.Best[s.Step] = append(d.Best[s.Step], byID[id])
		}
		for _, id := range s.Worst {
			prio[id] = true
			d.Worst[s.Step] = append(d.Worst[s.Step], byID[id])
		}
		// Prioritized first, so they take their half before the rest.
		order := make([]*Rollout, 0, len(s.Rollouts))
		for _, x := range s.Rollouts {
			if prio[x.ID] {
				order = append(order, x)
			}
		}
		for _, x := range s.Rollouts {
			if !prio[x.ID] {
				order = append(order, x)
			}
		}
		for _, x := range order {
			v := view(ctx, st, s, x, turns[x.ID], turns != nil, o.LogBytes)
			var b bytes.Buffer
			if err := tmpl.ExecuteTemplate(&b, "rollout", v); err != nil {
				return err
			}
			left := &restLeft
			if prio[x.ID] {
				left = &priorityLeft
				if priorityLeft < b.Len() && restLeft >= b.Len() {
					left = &restLeft
				}
			}
			if *left >= b.Len() {
				*left -= b.Len()
				d.Embedded = append(d.Embedded, template.HTML(b.String()))
				x.Page = "#" + v.Anchor
				continue
			}
			if x.Page, err = writeFile(v); err != nil {
				return err
			}
		}
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
