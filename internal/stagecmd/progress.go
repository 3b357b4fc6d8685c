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
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
}

// Progress reports work done: a redrawn bar on a terminal, a structured log
// line every Interval otherwise. Safe for concurrent use.
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

// Add records n more units done.
func (p *Progress) Add(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done += n
	now := time.Now()
	switch {
	case p.tty != nil && now.Sub(p.last) >= 100*time.Millisecond:
		p.last = now
		fmt.Fprint(p.tty, "\r"+p.bar(now))
	case p.tty == nil && now.Sub(p.last) >= p.Interval:
		p.last = now
		p.log.Info("progress", "task", p.label, "done", p.done, "total", p.total, "unit", p.unit,
			"rate_per_s", int64(float64(p.done)/now.Sub(p.start).Seconds()))
	}
}

// Done ends the report.
func (p *Progress) Done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if p.tty != nil {
		fmt.Fprint(p.tty, "\r"+p.bar(now)+"\n")
		return
	}
	p.log.Info("done", "task", p.label, "done", p.done, "unit", p.unit, "seconds", now.Sub(p.start).Seconds())
}

func (p *Progress) bar(now time.Time) string {
	rate := float64(p.done) / max(now.Sub(p.start).Seconds(), 1e-9)
	if p.total <= 0 {
		return fmt.Sprintf("%s %d %s (%.0f/s)", p.label, p.done, p.unit, rate)
	}
	const width = 30
	frac := min(float64(p.done)/float64(p.total), 1)
	fill := int(frac * width)
	return fmt.Sprintf("%s [%s%s] %d/%d %s (%.0f/s)", p.label, strings.Repeat("=", fill), strings.Repeat(" ", width-fill), p.done, p.total, p.unit, rate)
}
