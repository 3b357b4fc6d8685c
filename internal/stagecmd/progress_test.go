package stagecmd

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestFormatAmount(t *testing.T) {
	cases := []struct {
		unit string
		n    int64
		want string
	}{
		{UnitBytes, 0, "0 B"},
		{UnitBytes, 1023, "1023 B"},
		{UnitBytes, 1024, "1.0 KiB"},
		{UnitBytes, 1536, "1.5 KiB"},
		{UnitBytes, 389773312, "371.7 MiB"},
		{UnitBytes, 1559237632, "1.5 GiB"},
		{UnitBytes, 3 << 40, "3.0 TiB"},
		{UnitBytes, 1 << 62, "4.0 EiB"},
		{"rows", 0, "0 rows"},
		{"rows", 123456, "123456 rows"},
		{"patches", 4, "4 patches"},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, formatAmount(c.unit, c.n), "%d %s", c.n, c.unit)
	}
}

func TestFormatRate(t *testing.T) {
	cases := []struct {
		unit   string
		perSec float64
		want   string
	}{
		{UnitBytes, 512, "512 B/s"},
		{UnitBytes, 41.9 * (1 << 20), "41.9 MiB/s"},
		{"rows", 0, "0.0 rows/s"},
		{"rows", 12.46, "12.5 rows/s"},
		{"rows", 99.9, "99.9 rows/s"},
		{"rows", 1234.4, "1234 rows/s"},
		{"sessions", 250, "250 sessions/s"},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, formatRate(c.unit, c.perSec), "%v %s", c.perSec, c.unit)
	}
}

func TestFormatDuration(t *testing.T) {
	cases := []struct {
		d    time.Duration
		want string
	}{
		{0, "0ms"},
		{17*time.Millisecond + 762*time.Microsecond, "17ms"},
		{999 * time.Millisecond, "999ms"},
		{time.Second, "1.0s"},
		{2400 * time.Millisecond, "2.4s"},
		{9*time.Second + 940*time.Millisecond, "9.9s"},
		{45 * time.Second, "45s"},
		{65 * time.Second, "1m05s"},
		{59*time.Minute + 59*time.Second + 600*time.Millisecond, "60m00s"},
		{2*time.Hour + 3*time.Minute + 20*time.Second, "2h03m"},
		{30 * time.Hour, "30h00m"},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, formatDuration(c.d), "%v", c.d)
	}
}

// TestProgressLine pins the terminal line and the ETA: the mean rate so far
// extrapolated to the total; unknown without a total or before any work;
// the elapsed time once all is done.
func TestProgressLine(t *testing.T) {
	cases := []struct {
		name string
		s    progressState
		want string
		eta  string // "" when there is none
	}{
		{"bytes, a quarter done",
			progressState{label: "layer 1/2", unit: UnitBytes, done: 100 << 20, total: 400 << 20, elapsed: 10 * time.Second},
			"layer 1/2 [=======                       ] 100.0 MiB of 400.0 MiB (25%)  10.0 MiB/s  ETA 30s", "30s"},
		{"rows, nothing done yet",
			progressState{label: "grade", unit: "patches", done: 0, total: 8, elapsed: 2 * time.Second},
			"grade [                              ] 0 patches of 8 patches (0%)  0.0 patches/s  ETA -", ""},
		{"rows, long ETA",
			progressState{label: "grade", unit: "patches", done: 1, total: 1000, elapsed: 10 * time.Second},
			"grade [                              ] 1 patches of 1000 patches (0%)  0.1 patches/s  ETA 2h47m", "2h47m"},
		{"all done",
			progressState{label: "grade", unit: "patches", done: 4, total: 4, elapsed: 2500 * time.Millisecond},
			"grade [==============================] 4 patches of 4 patches (100%)  1.6 patches/s  in 2.5s", "0ms"},
		{"more than the total",
			progressState{label: "layer", unit: UnitBytes, done: 2048, total: 1024, elapsed: time.Second},
			"layer [==============================] 2.0 KiB of 1.0 KiB (100%)  2.0 KiB/s  in 1.0s", "0ms"},
		{"unknown total",
			progressState{label: "convert mimo", unit: "rows", done: 1500, elapsed: 3 * time.Second},
			"convert mimo 1500 rows  500 rows/s  3.0s", ""},
		{"no time yet",
			progressState{label: "import tasks", unit: "rows"},
			"import tasks 0 rows  -  0ms", ""},
		{"with a status",
			progressState{label: "rollout", unit: "runs", done: 3, total: 12, elapsed: 30 * time.Second, status: "running 8, aborted 1"},
			"rollout [=======                       ] 3 runs of 12 runs (25%)  0.1 runs/s  ETA 1m30s  running 8, aborted 1", "1m30s"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, c.s.bar())
			eta, ok := c.s.eta()
			if c.eta == "" {
				assert.False(t, ok)
				return
			}
			assert.True(t, ok)
			assert.Equal(t, c.eta, formatDuration(eta))
		})
	}
}

// TestProgressLog: off a terminal, the done line carries the human
// amount, rate and elapsed time beside the raw numbers.
func TestProgressLog(t *testing.T) {
	var buf bytes.Buffer
	p := NewProgress(&buf, NewLogger(&buf, false), "layer 1/1", UnitBytes, 3<<20)
	p.Add(3 << 20)
	p.Done()
	line := buf.String()
	assert.Contains(t, line, `msg=done task="layer 1/1" done=3145728 unit=bytes`)
	assert.Contains(t, line, `amount="3.0 MiB"`)
	assert.Regexp(t, `rate="[0-9.]+ [KMGTPE]?i?B/s" elapsed=[0-9.]+m?s`, line)
}

// TestProgressStatus: on a terminal the stage's status ends the bar, and
// Redraw draws it without a unit done; off a terminal Redraw writes
// nothing and the log lines carry no status.
func TestProgressStatus(t *testing.T) {
	var tty bytes.Buffer
	p := NewProgress(&tty, NewLogger(&tty, false), "rollout", "runs", 4)
	p.tty = &tty // a terminal
	assert.True(t, p.Terminal())
	calls := 0
	p.SetStatus(func(elapsed time.Duration) string {
		calls++
		assert.Greater(t, elapsed, time.Duration(0))
		return fmt.Sprintf("running %d", calls)
	})
	p.last = time.Time{} // past the redraw limit
	p.Redraw()
	assert.Regexp(t, `^\rrollout \[ +\] 0 runs of 4 runs \(0%\)  [0-9.]+ runs/s  ETA -  running 1\x1b\[K$`, tty.String())
	p.Redraw() // within 100 ms of the last: not drawn
	assert.Equal(t, 1, calls)
	tty.Reset()
	p.Add(4)
	p.Done()
	assert.Regexp(t, `^\rrollout \[=+\] 4 runs of 4 runs \(100%\)  [0-9.]+ runs/s  in [0-9.]+m?s  running 2\x1b\[K\n$`, tty.String())
	tty.Reset()
	p.last = time.Time{}
	p.Redraw() // after Done: nothing
	assert.Empty(t, tty.String())

	var logs bytes.Buffer
	q := NewProgress(&logs, NewLogger(&logs, false), "rollout", "runs", 4)
	assert.False(t, q.Terminal())
	q.SetStatus(func(time.Duration) string { t.Error("status called off a terminal"); return "" })
	q.last = time.Time{}
	q.Redraw()
	assert.Empty(t, logs.String())
	q.Done()
	assert.NotContains(t, logs.String(), "running")
}
