package report

import (
	"fmt"
	"html/template"
	"math"
	"sort"
	"strconv"
	"strings"
)

// A chart is one inline SVG line chart of per-step values (docs/report.md
// §1): every point is a <circle> carrying data-chart, data-series,
// data-step and data-value (the value as Go's shortest 'g' formatting),
// so a reader, and the browser test, can check it against the JSON.
type chart struct {
	ID, Title, Unit string
	Series          []series
}

type series struct {
	Name   string
	Points []point
}

type point struct {
	Step  int
	Value float64
}

// palette is the series' colours, in order.
var palette = []string{"#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4d7c0f", "#be185d"}

// fig adds a series of one per-step figure; steps without it get no point.
func fig(name string, steps []*Step, f func(*Step) *float64) series {
	s := series{Name: name}
	for _, st := range steps {
		if v := f(st); v != nil && !math.IsNaN(*v) && !math.IsInf(*v, 0) {
			s.Points = append(s.Points, point{st.Step, *v})
		}
	}
	return s
}

// FormatValue is how a chart's data-value spells a number.
func FormatValue(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// svg draws c; a chart with no point says so instead.
func (c chart) svg() template.HTML {
	const w, h, left, right, top, bottom = 380.0, 190.0, 52.0, 10.0, 12.0, 30.0
	var b strings.Builder
	n := 0
	lo, hi := math.Inf(1), math.Inf(-1)
	smin, smax := math.MaxInt, math.MinInt
	for _, s := range c.Series {
		for _, p := range s.Points {
			n++
			lo, hi = math.Min(lo, p.Value), math.Max(hi, p.Value)
			smin, smax = min(smin, p.Step), max(smax, p.Step)
		}
	}
	fmt.Fprintf(&b, `<figure class="chart" id="chart-%s"><figcaption>%s</figcaption>`, template.HTMLEscapeString(c.ID), template.HTMLEscapeString(c.Title))
	if n == 0 {
		b.WriteString(`<p class="empty">no step recorded this</p></figure>`)
		return template.HTML(b.String())
	}
	if lo > 0 && lo < hi && lo < (hi-lo) {
		lo = 0
	}
	if hi == lo {
		lo, hi = lo-1, hi+1
		if lo < 0 && hi-1 >= 0 {
			lo = 0
		}
	}
	if smax == smin {
		smin, smax = smin-1, smax+1
	}
	x := func(step int) float64 { return left + (w-left-right)*float64(step-smin)/float64(smax-smin) }
	y := func(v float64) float64 { return top + (h-top-bottom)*(1-(v-lo)/(hi-lo)) }
	fmt.Fprintf(&b, `<svg viewBox="0 0 %g %g" width="%g" height="%g" role="img" aria-label="%s">`, w, h, w, h, template.HTMLEscapeString(c.Title))
	// Axes, with the extremes and the middle labelled.
	fmt.Fprintf(&b, `<line class="axis" x1="%g" y1="%g" x2="%g" y2="%g"/><line class="axis" x1="%g" y1="%g" x2="%g" y2="%g"/>`,
		left, top, left, h-bottom, left, h-bottom, w-right, h-bottom)
	for _, v := range []float64{lo, (lo + hi) / 2, hi} {
		fmt.Fprintf(&b, `<line class="grid" x1="%g" y1="%.1f" x2="%g" y2="%.1f"/><text class="tick" x="%g" y="%.1f" text-anchor="end">%s</text>`,
			left, y(v), w-right, y(v), left-4, y(v)+3, short(v))
	}
	ticks := []int{smin, smax}
	if smax-smin > 1 {
		ticks = append(ticks, (smin+smax)/2)
	}
	for _, s := range ticks {
		fmt.Fprintf(&b, `<text class="tick" x="%.1f" y="%g" text-anchor="middle">%d</text>`, x(s), h-bottom+14, s)
	}
	fmt.Fprintf(&b, `<text class="tick" x="%g" y="%g" text-anchor="middle">step</text>`, left+(w-left-right)/2, h-4)
	for i, s := range c.Series {
		col := palette[i%len(palette)]
		pts := append([]point(nil), s.Points...)
		sort.Slice(pts, func(i, j int) bool { return pts[i].Step < pts[j].Step })
		var pl []string
		for _, p := range pts {
			pl = append(pl, fmt.Sprintf("%.1f,%.1f", x(p.Step), y(p.Value)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`, col, strings.Join(pl, " "))
		r := 3.0
		if len(pts) > 40 {
			r = 1.5
		}
		for _, p := range pts {
			fmt.Fprintf(&b, `<circle class="pt" cx="%.1f" cy="%.1f" r="%g" fill="%s" data-chart="%s" data-series="%s" data-step="%d" data-value="%s"><title>%s, step %d: %s</title></circle>`,
				x(p.Step), y(p.Value), r, col, template.HTMLEscapeString(c.ID), template.HTMLEscapeString(s.Name), p.Step, FormatValue(p.Value),
				template.HTMLEscapeString(s.Name), p.Step, FormatValue(p.Value))
		}
	}
	b.WriteString(`</svg><div class="legend">`)
	for i, s := range c.Series {
		fmt.Fprintf(&b, `<span><i style="background:%s"></i>%s</span>`, palette[i%len(palette)], template.HTMLEscapeString(s.Name))
	}
	b.WriteString(`</div></figure>`)
	return template.HTML(b.String())
}

// short is a tick label.
func short(v float64) string {
	a := math.Abs(v)
	switch {
	case v == 0:
		return "0"
	case a >= 1e6 || a < 1e-3:
		return strconv.FormatFloat(v, 'e', 1, 64)
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// histogram draws a distribution's bins as bars.
func histogram(id string, d *Distribution) template.HTML {
	if d == nil {
		return `<p class="empty">no advantages</p>`
	}
	const w, h, pad = 300.0, 110.0, 18.0
	top := 0
	for _, c := range d.Count {
		top = max(top, c)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="hist" id="%s" viewBox="0 0 %g %g" width="%g" height="%g" role="img" aria-label="advantage distribution">`, template.HTMLEscapeString(id), w, h, w, h)
	bw := (w - 2*pad) / float64(len(d.Count))
	for i, c := range d.Count {
		bh := (h - 2*pad) * float64(c) / float64(max(top, 1))
		fmt.Fprintf(&b, `<rect class="bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f" data-lo="%s" data-hi="%s" data-count="%d"><title>[%s, %s): %d</title></rect>`,
			pad+float64(i)*bw, h-pad-bh, math.Max(bw-1, 0.5), bh, FormatValue(d.Edges[i]), FormatValue(d.Edges[i+1]), c, short(d.Edges[i]), short(d.Edges[i+1]), c)
	}
	fmt.Fprintf(&b, `<text class="tick" x="%g" y="%g">%s</text><text class="tick" x="%g" y="%g" text-anchor="end">%s</text></svg>`,
		pad, h-4, short(d.Edges[0]), w-pad, h-4, short(d.Edges[len(d.Edges)-1]))
	return template.HTML(b.String())
}

// charts are the page's charts over the steps.
func charts(r *Report) []chart {
	s := r.Steps
	f := func(get func(Figures) *float64) func(*Step) *float64 {
		return func(st *Step) *float64 { return get(st.Figures) }
	}
	cs := []chart{
		{ID: "pass", Title: "pass rate and mean reward", Series: []series{
			fig("pass rate", s, f(func(x Figures) *float64 { return x.PassRate })),
			fig("mean reward", s, f(func(x Figures) *float64 { return x.MeanReward })),
			fig("pass@1", s, f(func(x Figures) *float64 { return x.PassAt1 })),
			fig("pass@k", s, f(func(x Figures) *float64 { return passAtMaxK(x.PassAtK) })),
		}},
		{ID: "groups", Title: "groups: all, with mixed rewards; group size", Series: []series{
			fig("groups", s, f(func(x Figures) *float64 { return x.Groups })),
			fig("mixed groups", s, f(func(x Figures) *float64 { return x.MixedGroups })),
			fig("group size", s, f(func(x Figures) *float64 { return x.GroupSize })),
		}},
		{ID: "advantage", Title: "advantage: min, mean, max, std", Series: []series{
			fig("min", s, func(st *Step) *float64 { return distField(st, func(d *Distribution) float64 { return d.Min }) }),
			fig("mean", s, func(st *Step) *float64 { return distField(st, func(d *Distribution) float64 { return d.Mean }) }),
			fig("max", s, func(st *Step) *float64 { return distField(st, func(d *Distribution) float64 { return d.Max }) }),
			fig("std", s, func(st *Step) *float64 { return distField(st, func(d *Distribution) float64 { return d.Std }) }),
		}},
		{ID: "tokens", Title: "tokens: prompt, response, trained", Series: []series{
			fig("prompt", s, func(st *Step) *float64 { return st.Rows.PromptTokens }),
			fig("response", s, func(st *Step) *float64 { return st.Rows.ResponseTokens }),
			fig("trained", s, f(func(x Figures) *float64 { return x.TrainedTokens })),
		}},
		{ID: "segments", Title: "segments per rollout (mean)", Series: []series{
			fig("segments per rollout", s, func(st *Step) *float64 { return st.Rows.SegmentsPerRollout }),
		}},
		{ID: "aborts", Title: "rollouts, aborted", Series: []series{
			fig("rollouts", s, f(func(x Figures) *float64 { return x.Rollouts })),
			fig("aborted", s, f(func(x Figures) *float64 { return x.Aborted })),
		}},
		{ID: "loss", Title: "loss (mean over optimizer steps)", Series: []series{fig("loss", s, f(func(x Figures) *float64 { return x.Loss }))}},
		{ID: "clipfrac", Title: "clip fraction", Series: []series{fig("pg_clipfrac", s, f(func(x Figures) *float64 { return x.ClipFrac }))}},
		{ID: "logprob", Title: "train_rollout_logprob_max_abs_diff (max)", Series: []series{fig("logprob diff", s, f(func(x Figures) *float64 { return x.LogprobDiff }))}},
		{ID: "gradnorm", Title: "grad norm", Series: []series{fig("grad_norm", s, f(func(x Figures) *float64 { return x.GradNorm }))}},
		{ID: "entropy", Title: "entropy", Series: []series{fig("entropy", s, f(func(x Figures) *float64 { return x.Entropy }))}},
		{ID: "kl", Title: "KL: ppo_kl, kl_loss", Series: []series{
			fig("ppo_kl", s, f(func(x Figures) *float64 { return x.PPOKL })),
			fig("kl_loss", s, f(func(x Figures) *float64 { return x.KLLoss })),
		}},
		{ID: "weights", Title: "weights sampled from, staleness", Series: []series{
			fig("weights number", s, f(func(x Figures) *float64 { return x.WeightsNumber })),
			fig("staleness", s, func(st *Step) *float64 { return st.Staleness }),
		}},
	}
	wall := chart{ID: "wall", Title: "wall time per stage (s)"}
	for _, stage := range stages(r) {
		wall.Series = append(wall.Series, fig(stage, s, func(st *Step) *float64 {
			if v, ok := st.Wall[stage]; ok {
				return &v
			}
			return nil
		}))
	}
	return append(cs, wall)
}

// stages are the steps' stage names in first appearance order.
func stages(r *Report) []string {
	var out []string
	for _, st := range r.Steps {
		for _, t := range st.Targets {
			if !contains(out, t.Stage) {
				out = append(out, t.Stage)
			}
		}
	}
	return out
}

func distField(st *Step, f func(*Distribution) float64) *float64 {
	if st.Rows.Advantage == nil {
		return nil
	}
	return ptr(f(st.Rows.Advantage))
}

// passAtMaxK is pass@k at the largest k recorded.
func passAtMaxK(m map[string]float64) *float64 {
	best, val := 0, 0.0
	for k, v := range m {
		if n, err := strconv.Atoi(k); err == nil && n > best {
			best, val = n, v
		}
	}
	if best == 0 {
		return nil
	}
	return &val
}
