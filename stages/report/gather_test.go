package report_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/stages/report"
	"github.com/kilnrl/kiln/stages/report/reporttest"
)

func TestGatherSmoke(t *testing.T) {
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	run := reporttest.Write(t, st, reporttest.Options{})
	file := reporttest.Pipeline(t, st, t.TempDir(), "rep", run)
	r, err := report.Gather(context.Background(), report.Options{Store: st, Pipeline: file})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.MarshalIndent(r, "", " ")
	t.Logf("%s", b[:min(len(b), 6000)])
}

func TestWriteSmoke(t *testing.T) {
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	run := reporttest.Write(t, st, reporttest.Options{})
	file := reporttest.Pipeline(t, st, t.TempDir(), "rep", run)
	r, err := report.Gather(context.Background(), report.Options{Store: st, Pipeline: file})
	if err != nil {
		t.Fatal(err)
	}
	if err := report.WriteHTML(context.Background(), st, r, report.HTMLOptions{Out: "/tmp/wt36-report/report.html", EmbedBytes: 40000}); err != nil {
		t.Fatal(err)
	}
}
