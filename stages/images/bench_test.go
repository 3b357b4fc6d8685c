package images_test

import (
	"archive/tar"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
	"github.com/stretchr/testify/require"
)

// BenchmarkImport imports a generated image (default ~1 GiB in 20k files
// over 4 gzip layers; KILN_BENCH_IMAGE_MB / KILN_BENCH_IMAGE_FILES set
// the size, -short uses 1%) from an OCI layout, and `umoci unpack`s the
// same layout in the same run. Reported: MB/s (uncompressed layer bytes)
// of kiln with its default flush to disk before the rename (kiln_MB/s),
// of kiln --no-sync (kiln_nosync_MB/s; umoci does not sync either), of
// umoci, and the ratios umoci time / kiln time (> 1: kiln is faster).
// Each run starts after a sync(2), untimed.
//
//	go test ./stages/images -run '^$' -bench BenchmarkImport -benchtime 1x
func BenchmarkImport(b *testing.B) {
	mb, files := envInt("KILN_BENCH_IMAGE_MB", 1024), envInt("KILN_BENCH_IMAGE_FILES", 20000)
	if testing.Short() {
		mb, files = max(mb/100, 1), max(files/100, 10)
	}
	umoci := needTool(b, "umoci")
	layoutDir, size := benchLayout(b, mb, files)
	store := b.TempDir()
	tasks := importTasks(b, store, tasksRow("bench", testRepo+":bench", "/testbed"))
	var kilnDur, noSyncDur, umociDur time.Duration
	scratch := b.TempDir()
	run := func(f func(dir string)) time.Duration {
		dir, err := os.MkdirTemp(scratch, "run-")
		require.NoError(b, err)
		// Start every run with no dirty pages, so none pays for the
		// previous one's writeback.
		syscall.Sync()
		b.StartTimer()
		t0 := time.Now()
		f(dir)
		d := time.Since(t0)
		b.StopTimer()
		require.NoError(b, os.RemoveAll(dir))
		return d
	}
	b.StopTimer()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, noSync := range []bool{false, true} {
			d := run(func(root string) {
				args := []string{"images", "import", "--store", store, "--tasks", tasks, "--root", root, "--source", testRepo + "=oci:" + layoutDir}
				if noSync {
					args = append(args, "--no-sync")
				}
				r := kiln(b, args...)
				require.Equal(b, 0, r.Code, r.Stderr)
			})
			if noSync {
				noSyncDur += d
			} else {
				kilnDur += d
			}
		}
		umociDur += run(func(dir string) {
			out, err := exec.Command(umoci, "unpack", "--image", layoutDir+":bench", filepath.Join(dir, "bundle")).CombinedOutput()
			require.NoError(b, err, "%s", out)
		})
	}
	mbs := func(d time.Duration) float64 { return float64(size) / 1e6 * float64(b.N) / d.Seconds() }
	b.ReportMetric(mbs(kilnDur), "kiln_MB/s")
	b.ReportMetric(mbs(noSyncDur), "kiln_nosync_MB/s")
	b.ReportMetric(mbs(umociDur), "umoci_MB/s")
	b.ReportMetric(umociDur.Seconds()/kilnDur.Seconds(), "speedup_vs_umoci")
	b.ReportMetric(umociDur.Seconds()/noSyncDur.Seconds(), "nosync_speedup_vs_umoci")
	b.ReportMetric(0, "ns/op")
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// benchLayout writes an OCI layout holding testRepo:bench, an image of
// mb MiB in files files (200 per directory) over 4 gzip layers, and
// returns it with the uncompressed tar bytes.
func benchLayout(b *testing.B, mb, files int) (string, int64) {
	b.Helper()
	dir := b.TempDir()
	rng := rand.New(rand.NewSource(1))
	// Text-like content (6 bits of entropy a byte): gzip gets ~25%.
	pool := make([]byte, 8<<20)
	const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \n"
	for i := range pool {
		pool[i] = letters[rng.Intn(len(letters))]
	}
	mean := int64(mb) << 20 / int64(files)
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	var total int64
	const nLayers = 4
	for l := 0; l < nLayers; l++ {
		gzPath := filepath.Join(dir, fmt.Sprintf("layer%d.tar.gz", l))
		f, err := os.Create(gzPath)
		require.NoError(b, err)
		zw, _ := gzip.NewWriterLevel(f, gzip.BestSpeed)
		cw := &countWriter{w: zw}
		tw := tar.NewWriter(cw)
		mt := time.Unix(1700000000, 0)
		for i := l; i < files; i += nLayers {
			d := fmt.Sprintf("usr/share/d%03d", i/200)
			if i%200 < nLayers {
				require.NoError(b, tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mt}))
			}
			size := mean/10 + rng.Int63n(mean*18/10+1)
			require.NoError(b, tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("%s/f%05d", d, i), Typeflag: tar.TypeReg, Mode: 0o644, Size: size, ModTime: mt}))
			for left := size; left > 0; {
				off := rng.Intn(len(pool) - 1)
				n := min(int64(len(pool)-off), left)
				_, err := tw.Write(pool[off : off+int(n)])
				require.NoError(b, err)
				left -= n
			}
		}
		require.NoError(b, tw.Close())
		require.NoError(b, zw.Close())
		require.NoError(b, f.Close())
		total += cw.n
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return os.Open(gzPath) }, tarball.WithMediaType(types.OCILayer))
		require.NoError(b, err)
		img, err = mutate.AppendLayers(img, layer)
		require.NoError(b, err)
	}
	cf, err := img.ConfigFile()
	require.NoError(b, err)
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	img, err = mutate.ConfigFile(img, cf)
	require.NoError(b, err)
	layoutDir := filepath.Join(dir, "layout")
	p, err := layout.Write(layoutDir, empty.Index)
	require.NoError(b, err)
	require.NoError(b, p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "bench"})))
	for l := 0; l < nLayers; l++ {
		os.Remove(filepath.Join(dir, fmt.Sprintf("layer%d.tar.gz", l)))
	}
	return layoutDir, total
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
