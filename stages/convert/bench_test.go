package convert_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/parquet-go/parquet-go"

	"github.com/kilnrl/kiln/fixtures"
)

// benchRows is the MiMo benchmark size: KILN_BENCH_MIMO_ROWS, else 100,000
// rows (about 2 GB of Parquet), or 1,000 under -short (CI).
func benchRows(b *testing.B) int {
	if s := os.Getenv("KILN_BENCH_MIMO_ROWS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			b.Fatalf("KILN_BENCH_MIMO_ROWS=%q: want a positive number", s)
		}
		return n
	}
	if testing.Short() {
		return 1000
	}
	return 100_000
}

// BenchmarkConvertMiMo converts a generated MiMo-shaped code.parquet
// (fixtures.WriteMiMoFiles: ~4 KB problem statements, ~24 KB test patches)
// and, in the same run, measures the baseline: reading only the
// extra_info.instance_json column with parquet-go and decoding each object
// with encoding/json, which any converter must do. kiln is the built
// kiln-convert binary run as a subprocess into a fresh local store (the
// input's sha256 for the version id, the conversion, Parquet+zstd shards,
// the commit), so its peak RSS is the process's own high-water mark.
// Reported: rows/s and input MB/s of both, kiln/baseline time, peak RSS.
//
//	KILN_BENCH_MIMO_ROWS=100000 go test ./stages/convert -run '^$' -bench ConvertMiMo -benchtime 1x -timeout 60m
func BenchmarkConvertMiMo(b *testing.B) {
	rows := benchRows(b)
	dir := b.TempDir()
	data := filepath.Join(dir, "mimo")
	if err := os.Mkdir(data, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := fixtures.WriteMiMoFiles(filepath.Join(data, "code.parquet"), filepath.Join(data, "image-mapping.jsonl"), fixtures.BigOptions{Rows: rows, Seed: 1}); err != nil {
		b.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(data, "code.parquet"))
	if err != nil {
		b.Fatal(err)
	}
	mb := float64(fi.Size()) / 1e6
	bin := filepath.Join(dir, "kiln-convert")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/kiln-convert").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// Baseline.
		start := time.Now()
		n, err := baselineDecode(filepath.Join(data, "code.parquet"))
		if err != nil {
			b.Fatal(err)
		}
		base := time.Since(start)
		if n != rows {
			b.Fatalf("baseline read %d rows, want %d", n, rows)
		}

		// kiln.
		storeDir := filepath.Join(dir, fmt.Sprintf("store-%d", i))
		cmd := exec.Command(bin, "mimo", "--store", storeDir, "--data", data, "--out", "tasks/bench")
		cmd.Stderr = io.Discard
		start = time.Now()
		out, err := cmd.Output()
		kiln := time.Since(start)
		if err != nil {
			b.Fatalf("kiln-convert: %v\n%s", err, out)
		}
		ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
		maxRSS := ru.Maxrss // KiB on Linux
		cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		os.RemoveAll(storeDir)

		b.ReportMetric(float64(rows)/kiln.Seconds(), "rows/s")
		b.ReportMetric(mb/kiln.Seconds(), "MB/s")
		b.ReportMetric(float64(rows)/base.Seconds(), "baseline_rows/s")
		b.ReportMetric(mb/base.Seconds(), "baseline_MB/s")
		b.ReportMetric(kiln.Seconds()/base.Seconds(), "kiln/baseline")
		// CPU seconds: kiln's process (all threads) against the baseline's
		// single-threaded wall time; on a shared machine this is the
		// steadier comparison.
		b.ReportMetric(cpu.Seconds()/base.Seconds(), "kiln_cpu/baseline")
		b.ReportMetric(float64(maxRSS)/1024, "peak_rss_MiB")
		b.ReportMetric(mb, "input_MB")
	}
}

// baselineDecode reads only extra_info.instance_json, page by page, and
// decodes every object: the floor of any MiMo converter.
func baselineDecode(path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	pf, err := parquet.OpenFile(f, fi.Size(), parquet.SkipPageIndex(true), parquet.SkipBloomFilters(true))
	if err != nil {
		return 0, err
	}
	col := pf.Root().Column("extra_info").Column("instance_json")
	if col == nil {
		return 0, errors.New("no extra_info.instance_json")
	}
	n := 0
	values := make([]parquet.Value, 64)
	for _, rg := range pf.RowGroups() {
		pages := rg.ColumnChunks()[col.Index()].Pages()
		for {
			page, err := pages.ReadPage()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return n, err
			}
			r := page.Values()
			for {
				k, err := r.ReadValues(values)
				for _, v := range values[:k] {
					var obj map[string]any
					if err := json.Unmarshal(v.ByteArray(), &obj); err != nil {
						return n, err
					}
					n++
				}
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					return n, err
				}
			}
			parquet.Release(page)
		}
		pages.Close()
	}
	return n, nil
}
