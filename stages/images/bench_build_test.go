package images_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/fixtures"
)

// BenchmarkBuildHarbor times kiln-images build of the Dockerfile fixture
// (fixtures/harbor/duration-dockerfile: FROM the fixture image, a COPY and
// a RUN step) against buildah bud of the same context run directly, in
// alternating order, KILN_BENCH_ROUNDS rounds (3; 1 with -short):
//   - kiln: kiln-images build with a fresh build cache, so it builds:
//     resolving FROM offline, handing it to buildah, buildah bud, pushing
//     the result to the cache, removing its buildah storage, and importing
//     the image as a bundle (into one bundle root kept across rounds, as on
//     a sandbox node: the base layer is there from the first round);
//   - buildah: with fresh storage, buildah pull of the base from the
//     fixtures' OCI layout, buildah tag with the name the Dockerfile uses,
//     buildah bud --isolation chroot: the least a daemonless build does.
//
// KILN_BENCH_BUILD_GZIP=1 gives both a copy of the base with gzip layers,
// as a registry serves images (the fixtures' are stored uncompressed);
// KILN_BENCH_BUILD_GZIP=warm too, with kiln's build cache keeping the base
// it decompressed in round 1 (BUILD-CACHE/.bases): every later task of a
// dataset FROM that base.
// Reported: the median of kiln time / buildah time (goal ≤ 1.1) and its
// spread; the load average (/proc/loadavg) before and after is logged.
//
//	go test ./stages/images -run '^$' -bench BuildHarbor -benchtime 1x -timeout 30m
func BenchmarkBuildHarbor(b *testing.B) {
	buildah := needTool(b, "buildah")
	if os.Geteuid() != 0 {
		b.Skip("kiln-images build runs buildah as root (chroot isolation)")
	}
	rounds := envInt("KILN_BENCH_ROUNDS", 3)
	if testing.Short() {
		rounds = 1
	}
	set, err := fixtures.Load(context.Background())
	require.NoError(b, err)
	src, err := filepath.Abs("../../fixtures/harbor/duration-dockerfile")
	require.NoError(b, err)
	store, root, scratch := b.TempDir(), b.TempDir(), b.TempDir()
	r := kiln(b, "convert", "harbor", "--store", store, src)
	require.Equal(b, 0, r.Code, r.Stderr)
	tasks := r.LastLine()
	ctxDir := filepath.Join(src, "environment")
	const base = "kiln.local/fixtures:fixture-duration-001"
	// buildah names an oci: image after its path, which must then be a
	// valid repository name: neither the fixtures' (under ~/.cache) nor
	// the benchmark's temporary directory (capitals) is.
	linkDir, err := os.MkdirTemp("", "kilnbench")
	require.NoError(b, err)
	defer os.RemoveAll(linkDir)
	baseLayout, source := filepath.Join(linkDir, "base"), set.Layout
	if os.Getenv("KILN_BENCH_BUILD_GZIP") != "" {
		source = gzipBase(b, set, linkDir, true)
	}
	require.NoError(b, os.Symlink(source, baseLayout))

	load := func() string {
		l, _ := os.ReadFile("/proc/loadavg")
		return strings.TrimSpace(string(l))
	}
	b.Logf("load before: %s", load())
	warm := os.Getenv("KILN_BENCH_BUILD_GZIP") == "warm"
	kilnBuild := func(dir string) {
		cache := filepath.Join(dir, "cache")
		if warm {
			// One build cache, emptied but for the decompressed bases
			// after each round: a later task FROM the same base.
			cache = filepath.Join(scratch, "warm-cache")
			ents, _ := os.ReadDir(cache)
			for _, e := range ents {
				if e.Name() != ".bases" {
					require.NoError(b, os.RemoveAll(filepath.Join(cache, e.Name())))
				}
			}
		}
		r := kiln(b, "images", "build", "--store", store, "--tasks", tasks, "--bundles", root,
			"--build-cache", cache, "--source", set.Repository+"=oci:"+source, "--out", "images/bench")
		require.Equal(b, 0, r.Code, r.Stderr)
		require.Contains(b, r.Stderr, "build: 1 image(s) built")
	}
	var cleanup []string
	direct := func(dir string) {
		st := filepath.Join(dir, "storage")
		cleanup = append(cleanup, st)
		bud := func(args ...string) string {
			cmd := exec.Command(buildah, append([]string{"--root", filepath.Join(st, "root"), "--runroot", filepath.Join(st, "runroot"),
				"--storage-driver", "overlay"}, args...)...)
			cmd.Env = append(os.Environ(), "BUILDAH_ISOLATION=chroot")
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			require.NoError(b, err, "buildah %s: %s", args[0], stderr.String())
			return strings.TrimSpace(string(out))
		}
		id := bud("pull", "--quiet", "oci:"+baseLayout+":fixture-duration-001")
		bud("tag", id, base)
		bud("bud", "--isolation", "chroot", "--pull-never", "--layers=false", "-f", filepath.Join(ctxDir, "Dockerfile"), "-t", "bench", ctxDir)
	}
	ways := []struct {
		name string
		do   func(string)
	}{{"kiln", kilnBuild}, {"buildah", direct}}
	var ratios []float64
	b.ResetTimer()
	for b.Loop() {
		for rd := range rounds {
			got := map[string]float64{}
			for k := range ways {
				w := ways[(k+rd)%len(ways)] // alternate: neither always first
				dir, err := os.MkdirTemp(scratch, w.name+"-")
				require.NoError(b, err)
				t0 := time.Now()
				w.do(dir)
				got[w.name] = time.Since(t0).Seconds()
			}
			ratios = append(ratios, got["kiln"]/got["buildah"])
			b.Logf("round %d: kiln-images build %.2fs, buildah bud %.2fs, ratio %.3f", rd+1, got["kiln"], got["buildah"], got["kiln"]/got["buildah"])
		}
	}
	b.StopTimer()
	for _, st := range cleanup {
		cmd := exec.Command(buildah, "--root", filepath.Join(st, "root"), "--runroot", filepath.Join(st, "runroot"), "--storage-driver", "overlay", "rmi", "--all", "--force")
		_ = cmd.Run()
	}
	b.Logf("load after: %s", load())
	v := slices.Clone(ratios)
	slices.Sort(v)
	med := v[len(v)/2]
	// As metrics too: go test keeps only the first lines of a
	// benchmark's log.
	b.ReportMetric(med, "kiln/buildah")
	b.ReportMetric(v[0], "min-ratio")
	b.ReportMetric(v[len(v)-1], "max-ratio")
	b.Logf("kiln-images build / buildah bud: median %.3f, spread %.3f–%.3f over %d rounds", med, v[0], v[len(v)-1], len(v))
	b.ReportMetric(0, "ns/op")
}
