package images_test

import (
	"archive/tar"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/stages/images"
)

// BenchmarkImportShared imports KILN_BENCH_SHARED_IMAGES (50) generated
// task images that share one base layer (KILN_BENCH_SHARED_BASE_MB, 64 MiB
// in 2,000 files) and each add a task layer of their own
// (KILN_BENCH_SHARED_TASK_MB, 1 MiB in 20 files); -short: 5 images, a 4 MiB
// base. Each round times, one after another in a rotating order, each after
// an untimed sync(2), on a fresh directory:
//   - layered: kiln-images import (the layer store; -j 2);
//   - rootfs: kiln-images import --layout rootfs (one whole rootfs per
//     image, as before the layer store; -j 2);
//   - umoci: `umoci unpack` of every image, 2 at a time;
//   - once: kiln-images import --layout rootfs of one image holding the
//     base and every task layer: each unique layer unpacked once, the
//     floor the layered import is judged against.
//
// Reported: the medians over KILN_BENCH_ROUNDS rounds (3; 1 with -short)
// of layered disk / unique layer bytes (goal ≤ 1.1), layered time / once
// time (goal ≤ 1.2), and rootfs and umoci time and disk over layered; the
// spread of each is logged. Disk is allocated blocks (a file with several
// names once) of everything the run left in its directory.
//
//	go test ./stages/images -run '^$' -bench ImportShared -benchtime 1x -timeout 60m
func BenchmarkImportShared(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("the layered form needs root")
	}
	n, baseMB, taskMB, rounds := envInt("KILN_BENCH_SHARED_IMAGES", 50), envInt("KILN_BENCH_SHARED_BASE_MB", 64), envInt("KILN_BENCH_SHARED_TASK_MB", 1), envInt("KILN_BENCH_ROUNDS", 3)
	if testing.Short() {
		n, baseMB, rounds = min(n, 5), min(baseMB, 4), 1
	}
	umoci := needTool(b, "umoci")
	layoutDir, unique := sharedBenchLayout(b, n, baseMB, taskMB)
	store := b.TempDir()
	var rows []string
	for i := range n {
		rows = append(rows, tasksRow(fmt.Sprintf("t%03d", i), fmt.Sprintf("%s:task-%03d", testRepo, i), "/testbed"))
	}
	tasks := importTasks(b, store, rows...)
	onceTasks := importTasks(b, store, tasksRow("once", testRepo+":once", "/testbed"))
	scratch := b.TempDir()
	type result struct{ secs, disk float64 }
	run := func(f func(dir string)) result {
		dir, err := os.MkdirTemp(scratch, "run-")
		require.NoError(b, err)
		syscall.Sync()
		t0 := time.Now()
		f(dir)
		d := time.Since(t0)
		disk, err := images.DiskUse(dir)
		require.NoError(b, err)
		require.NoError(b, os.RemoveAll(dir))
		return result{d.Seconds(), float64(disk)}
	}
	importer := func(tasks string, extra ...string) func(string) {
		return func(root string) {
			args := append([]string{"images", "import", "--store", store, "--tasks", tasks, "--bundles", root, "--source", testRepo + "=oci:" + layoutDir, "-j", "2"}, extra...)
			r := kiln(b, args...)
			require.Equal(b, 0, r.Code, r.Stderr)
		}
	}
	ways := []struct {
		name string
		do   func(string)
	}{
		{"layered", importer(tasks)},
		{"rootfs", importer(tasks, "--layout", "rootfs")},
		{"umoci", func(dir string) {
			work := make(chan int)
			var wg sync.WaitGroup
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range work {
						out, err := exec.Command(umoci, "unpack", "--image", fmt.Sprintf("%s:task-%03d", layoutDir, i), filepath.Join(dir, fmt.Sprint(i))).CombinedOutput()
						require.NoError(b, err, "%s", out)
					}
				}()
			}
			for i := range n {
				work <- i
			}
			close(work)
			wg.Wait()
		}},
		{"once", importer(onceTasks, "--layout", "rootfs")},
	}
	ratios := map[string][]float64{}
	b.ResetTimer()
	for b.Loop() {
		for r := range rounds {
			got := map[string]result{}
			for k := range ways {
				w := ways[(k+r)%len(ways)] // rotate: no way always first or last
				got[w.name] = run(w.do)
			}
			l := got["layered"]
			for k, v := range map[string]float64{
				"layered_disk/unique": l.disk / float64(unique),
				"layered_time/once":   l.secs / got["once"].secs,
				"rootfs_time/layered": got["rootfs"].secs / l.secs,
				"rootfs_disk/layered": got["rootfs"].disk / l.disk,
				"umoci_time/layered":  got["umoci"].secs / l.secs,
				"umoci_disk/layered":  got["umoci"].disk / l.disk,
			} {
				ratios[k] = append(ratios[k], v)
			}
			b.Logf("round %d: layered %.2fs %.1f MB; rootfs %.2fs %.1f MB; umoci %.2fs %.1f MB; once %.2fs %.1f MB; unique layers %.1f MB",
				r+1, l.secs, l.disk/1e6, got["rootfs"].secs, got["rootfs"].disk/1e6, got["umoci"].secs, got["umoci"].disk/1e6,
				got["once"].secs, got["once"].disk/1e6, float64(unique)/1e6)
		}
	}
	keys := make([]string, 0, len(ratios))
	for k := range ratios {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := slices.Clone(ratios[k])
		slices.Sort(v)
		med := v[len(v)/2]
		b.ReportMetric(med, k)
		b.Logf("%s: median %.3f, spread %.3f–%.3f over %d rounds", k, med, v[0], v[len(v)-1], len(v))
	}
	b.ReportMetric(float64(unique)/1e6, "unique_MB")
	b.ReportMetric(0, "ns/op")
}

// sharedBenchLayout writes an OCI layout of n images task-NNN (the base
// layer, then a task layer of their own under testbed/task-NNN) and once
// (the base, then all n task layers), and returns it with the unique
// layers' uncompressed bytes (the base and each task layer once).
func sharedBenchLayout(b *testing.B, n, baseMB, taskMB int) (string, int64) {
	b.Helper()
	dir := b.TempDir()
	rng := rand.New(rand.NewSource(1))
	pool := make([]byte, 8<<20)
	const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \n"
	for i := range pool {
		pool[i] = letters[rng.Intn(len(letters))]
	}
	var unique int64
	gen := func(name, prefix string, mb, files int) v1.Layer {
		gzPath := filepath.Join(dir, name+".tar.gz")
		f, err := os.Create(gzPath)
		require.NoError(b, err)
		zw, _ := gzip.NewWriterLevel(f, gzip.BestSpeed)
		cw := &countWriter{w: zw}
		tw := tar.NewWriter(cw)
		mt := time.Unix(1700000000, 0)
		mean := int64(mb) << 20 / int64(files)
		for i := range files {
			d := fmt.Sprintf("%s/d%03d", prefix, i/200)
			if i%200 == 0 {
				require.NoError(b, tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mt}))
			}
			size := mean/10 + rng.Int63n(mean*18/10+1)
			require.NoError(b, tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("%s/f%05d", d, i), Typeflag: tar.TypeReg, Mode: 0o644, Size: size, ModTime: mt}))
			for left := size; left > 0; {
				off := rng.Intn(len(pool) - 1)
				k := min(int64(len(pool)-off), left)
				_, err := tw.Write(pool[off : off+int(k)])
				require.NoError(b, err)
				left -= k
			}
		}
		require.NoError(b, tw.Close())
		require.NoError(b, zw.Close())
		require.NoError(b, f.Close())
		unique += cw.n
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return os.Open(gzPath) }, tarball.WithMediaType(types.OCILayer))
		require.NoError(b, err)
		return l
	}
	image := func(layers ...v1.Layer) v1.Image {
		img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
		img, err := mutate.AppendLayers(img, layers...)
		require.NoError(b, err)
		cf, err := img.ConfigFile()
		require.NoError(b, err)
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture = "linux", "amd64"
		img, err = mutate.ConfigFile(img, cf)
		require.NoError(b, err)
		return img
	}
	base := gen("base", "usr/share", baseMB, max(baseMB*2000/64, 20))
	layoutDir := filepath.Join(dir, "layout")
	p, err := layout.Write(layoutDir, empty.Index)
	require.NoError(b, err)
	all := []v1.Layer{base}
	for i := range n {
		name := fmt.Sprintf("task-%03d", i)
		task := gen(name, "testbed/"+name, taskMB, 20)
		all = append(all, task)
		require.NoError(b, p.AppendImage(image(base, task), layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": name})))
	}
	require.NoError(b, p.AppendImage(image(all...), layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "once"})))
	return layoutDir, unique
}
