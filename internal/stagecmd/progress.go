package stagecmd

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"
)

// IsTerminal reports whether w is a character device (an interactive terminal).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// NewLogger returns the structured logger of a binary: key=value lines on
// stderr, which Slurm captures in the job's log.
func NewLogger(stderr io.Writer, verbose bool) *slog.Logger {
	return NewLoggerFormat(stderr, verbose, "text")
}

// NewLoggerFormat is NewLogger writing format "json" (one JSON object per
// line) or "text" (key=value).
func NewLoggerFormat(stderr io.Writer, verbose bool, format string) *slog.Logger {
	opts := &slog.HandlerOptions{Level: slog.LevelInfo}
	if verbose {
		opts.Level = slog.LevelDebug
	}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(stderr, opts))
	}
	return slog.New(slog.NewTextHandler(stderr, opts))
}

// UnitBytes is the unit of a Progress that counts bytes: its amounts and
// rates print in binary units (KiB, MiB, ...). Any other unit ("rows",
// "patches") prints as a count with the unit's name.
const UnitBytes = "bytes"

// Progress reports work done: a redrawn bar on a terminal, a structured log
// line every Interval otherwise. Both carry the amount in the unit's own
// terms (B/KiB/MiB..., or N rows), the rate, and, when the total is known,
// the estimated time left. A stage may add live fields of its own to the
// bar (SetStatus) and redraw it between Adds (Redraw). Safe for concurrent
// use.
type Progress struct {
	mu       sync.Mutex
	label    string
	unit     string
	total    int64
	done     int64
	start    time.Time
	last     time.Time
	tty      io.Writer // nil when not a terminal
	log      *slog.Logger
	status   func(elapsed time.Duration) string
	ended    bool // Done was called: Redraw draws nothing
	Interval time.Duration
}

// NewProgress starts a progress report; total <= 0 means unknown.
func NewProgress(stderr io.Writer, log *slog.Logger, label, unit string, total int64) *Progress {
	p := &Progress{label: label, unit: unit, total: total, start: time.Now(), log: log, Interval: 10 * time.Second}
	if IsTerminal(stderr) {
		p.tty = stderr
	}
	p.last = p.start
	return p
}

// Terminal reports whether the report is a bar on a terminal (else log
// lines).
func (p *Progress) Terminal() bool { return p.tty != nil }

// SetStatus makes the bar end with status(elapsed since the start): a
// stage's live fields ("running 3, 2.5 turns/s"). It is called at every
// redraw with the Progress's lock held, so it must not call the Progress.
// Off a terminal it is not used: the stage logs such fields itself.
func (p *Progress) SetStatus(status func(elapsed time.Duration) string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.status = status
}

// Redraw redraws the bar (on a terminal, at most every 100 ms, and not
// after Done; otherwise nothing), for a status that changes while no unit
// finishes.
func (p *Progress) Redraw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now := time.Now(); p.tty != nil && !p.ended && now.Sub(p.last) >= 100*time.Millisecond {
		p.draw(now, "")
	}
}

// draw writes the bar on the terminal; end follows it ("" or "\n").
func (p *Progress) draw(now time.Time, end string) {
	p.last = now
	// \x1b[K clears what a longer earlier bar left on the line.
	fmt.Fprint(p.tty, "\r"+p.state(now).bar()+"\x1b[K"+end)
}

// Add records n more units done.
func (p *Progress) Add(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done += n
	now := time.Now()
	switch {
	case p.tty != nil && now.Sub(p.last) >= 100*time.Millisecond:
		p.draw(now, "")
	case p.tty == nil && now.Sub(p.last) >= p.Interval:
		p.last = now
		s := p.state(now)
		args := []any{"task", p.label, "done", p.done, "total", p.total, "unit", p.unit,
			"rate_per_s", int64(s.rate()), "progress", s.amount(), "rate", s.rateText()}
		if eta, ok := s.eta(); ok {
			args = append(args, "eta", formatDuration(eta))
		}
		p.log.Info("progress", args...)
	}
}

// Done ends the report.
func (p *Progress) Done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	p.ended = true
	if p.tty != nil {
		p.draw(now, "\n")
		return
	}
	s := p.state(now)
	p.log.Info("done", "task", p.label, "done", p.done, "unit", p.unit, "seconds", s.elapsed.Seconds(),
		"amount", formatAmount(p.unit, p.done), "rate", s.rateText(), "elapsed", formatDuration(s.elapsed))
}

func (p *Progress) state(now time.Time) progressState {
	s := progressState{label: p.label, unit: p.unit, done: p.done, total: p.total, elapsed: now.Sub(p.start)}
	if p.status != nil && p.tty != nil {
		s.status = p.status(s.elapsed)
	}
	return s
}

// progressState is one moment of a Progress, formatted without a clock so
// the tests can pin every case.
type progressState struct {
	label       string
	unit        string
	done, total int64 // total <= 0: unknown
	elapsed     time.Duration
	status      string // the stage's live fields, after the rest ("" none)
}

func (s progressState) rate() float64 {
	return float64(s.done) / max(s.elapsed.Seconds(), 1e-9)
}

func (s progressState) rateText() string {
	if s.elapsed <= 0 {
		return "-"
	}
	return formatRate(s.unit, s.rate())
}

// eta is the time left at the mean rate so far; ok is false when the total
// is unknown or nothing is done yet (no rate to extrapolate).
func (s progressState) eta() (time.Duration, bool) {
	if s.total <= 0 || s.done <= 0 || s.elapsed <= 0 {
		return 0, false
	}
	left := max(s.total-s.done, 0)
	return time.Duration(float64(left) / s.rate() * float64(time.Second)), true
}

// amount is "12.0 MiB of 40.0 MiB (30%)", or "12.0 MiB" without a total.
func (s progressState) amount() string {
	if s.total <= 0 {
		return formatAmount(s.unit, s.done)
	}
	pct := int(min(float64(s.done)/float64(s.total), 1) * 100)
	return fmt.Sprintf("%s of %s (%d%%)", formatAmount(s.unit, s.done), formatAmount(s.unit, s.total), pct)
}

// bar is the terminal line: the label, a bar when the total is known, the
// amount, the rate, and the ETA (elapsed time once nothing is left), then
// the status if any.
func (s progressState) bar() string {
	line := s.line()
	if s.status != "" {
		line += "  " + s.status
	}
	return line
}

func (s progressState) line() string {
	if s.total <= 0 {
		return fmt.Sprintf("%s %s  %s  %s", s.label, formatAmount(s.unit, s.done), s.rateText(), formatDuration(s.elapsed))
	}
	const width = 30
	frac := min(float64(s.done)/float64(s.total), 1)
	fill := int(frac * width)
	tail := "ETA -"
	if eta, ok := s.eta(); ok && eta > 0 {
		tail = "ETA " + formatDuration(eta)
	} else if ok {
		tail = "in " + formatDuration(s.elapsed)
	}
	return fmt.Sprintf("%s [%s%s] %s  %s  %s", s.label, strings.Repeat("=", fill), strings.Repeat(" ", width-fill), s.amount(), s.rateText(), tail)
}

// formatAmount prints n of unit: bytes in binary units with one decimal
// ("512 B", "1.5 KiB", "372.0 MiB"), any other unit as "N unit".
func formatAmount(unit string, n int64) string {
	if unit != UnitBytes {
		return fmt.Sprintf("%d %s", n, unit)
	}
	return formatBytes(float64(n))
}

func formatBytes(n float64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return fmt.Sprintf("%.0f B", n)
	}
	i := 0
	for n /= 1024; n >= 1024 && i < len(units)-1; i++ {
		n /= 1024
	}
	return fmt.Sprintf("%.1f %ciB", n, units[i])
}

// formatRate prints a rate: "41.2 MiB/s" for bytes, "12.5 rows/s" below
// 100 units a second, "1234 rows/s" above.
func formatRate(unit string, perSec float64) string {
	if unit == UnitBytes {
		return formatBytes(perSec) + "/s"
	}
	if perSec < 100 {
		return fmt.Sprintf("%.1f %s/s", perSec, unit)
	}
	return fmt.Sprintf("%.0f %s/s", perSec, unit)
}

// formatDuration prints a duration to the precision a person reads a
// progress report at: "18ms", "2.4s", "45s", "1m05s", "2h03m".
func formatDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < 10*time.Second:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		d = d.Round(time.Second)
		return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	}
	d = d.Round(time.Minute)
	return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
}
