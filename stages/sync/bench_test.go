package sync_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/formats/store/storetest"
)

// BenchmarkSync publishes and pulls a generated checkpoint on versitygw
// over loopback, beside a plain S3 client (minio-go, the client kiln's S3
// store uses) doing only what kiln cannot avoid, alternating in rounds so
// the shared machine's load hits both (docs/sync.md §1, §2):
//
//   - full publish (kiln-sync publish --full: read, hash, upload every
//     engine file) beside PutObject of the same files, as many at once as
//     kiln uploads (8);
//   - full pull (kiln-sync pull into an empty directory: ranged GETs,
//     sha256 of every file, fsync, rename) beside GetObject of every file
//     to disk, as many at once;
//   - delta publish of the same checkpoint with 5% of its tensors changed
//     (--base-dir: the pulled base, so xor payloads) beside PutObject of
//     just the changed tensors' bytes; its stored bytes against those raw
//     bytes is the size figure.
//
// kiln runs as the built binary, so its peak RSS (getrusage of the
// child) is its own. Size: KILN_BENCH_SYNC_BYTES (default 8 GiB; 64 MiB
// with -short), rounds: KILN_BENCH_SYNC_ROUNDS (default 3; 1 with -short).
// Goals (BENCHMARKS.md): stored ≤ 1.1× the changed bytes, full publish ≤
// 1.2× the plain upload, pull ≤ 1.2× the plain download, peak RSS ≤ 256
// MiB.
func BenchmarkSync(b *testing.B) {
	size := benchEnv(b, "KILN_BENCH_SYNC_BYTES", 8<<30, 64<<20)
	rounds := int(benchEnv(b, "KILN_BENCH_SYNC_ROUNDS", 3, 1))
	tensorSize := int64(32 << 20)
	shardSize := int64(2 << 30)
	if size < 1<<30 {
		tensorSize, shardSize = 1<<20, 16<<20
	}
	root := b.TempDir()
	bin := buildSync(b, root)
	ctx := context.Background()

	a, bdir := filepath.Join(root, "ckpt-a"), filepath.Join(root, "ckpt-b")
	t0 := time.Now()
	changed := writeBenchCheckpoint(b, a, bdir, size, tensorSize, shardSize)
	var changedBytes int64
	for _, c := range changed {
		changedBytes += int64(len(c.data))
	}
	b.Logf("checkpoint: %d bytes in %s; %d changed tensors, %d bytes (%.1f%%); generated in %s",
		size, a, len(changed), changedBytes, 100*float64(changedBytes)/float64(size), time.Since(t0).Round(time.Millisecond))

	v := storetest.VersityServer(b)
	bucket := v.NewBucket(b)
	s3 := v.Open(b, "s3://"+bucket)
	client := s3.Client()
	env := append(v.Environ(), "KILN_QUIET=1")
	storeURI := "s3://" + bucket + "/kiln"
	files := engineFiles(b, a)

	var fullPub, plainUp, pull, plainDown, deltaPub, plainDelta []time.Duration
	var storedRatio []float64
	// Peak RSS of each command, the largest over the rounds.
	var rssFull, rssPull, rssDelta int64
	b.ResetTimer()
	for i := range b.N {
		for r := range rounds {
			tag := fmt.Sprintf("%d-%d", i, r)
			name := "weights/bench-" + tag

			t0 := time.Now()
			plainPut(b, client, bucket, "plain/"+tag+"/full/", a, files)
			plainUp = append(plainUp, time.Since(t0))

			d, rss, ref := runSync(b, bin, env, "publish", "--store", storeURI, "--checkpoint", a, "--out", name, "--full")
			fullPub, rssFull = append(fullPub, d), max(rssFull, rss)

			t0 = time.Now()
			down := filepath.Join(root, "plain-down-"+tag)
			plainGet(b, client, bucket, "plain/"+tag+"/full/", down, files)
			plainDown = append(plainDown, time.Since(t0))
			require.NoError(b, os.RemoveAll(down))

			pulled := filepath.Join(root, "pull-"+tag)
			d, rss, _ = runSync(b, bin, env, "pull", "--store", storeURI, "--weights", ref, "--to", pulled)
			pull, rssPull = append(pull, d), max(rssPull, rss)

			t0 = time.Now()
			g, gctx := errgroup.WithContext(ctx)
			g.SetLimit(8)
			for k, c := range changed {
				g.Go(func() error {
					_, err := client.PutObject(gctx, bucket, fmt.Sprintf("plain/%s/delta/%d", tag, k), strings.NewReader(string(c.data)), int64(len(c.data)), minio.PutObjectOptions{})
					return err
				})
			}
			require.NoError(b, g.Wait())
			plainDelta = append(plainDelta, time.Since(t0))

			d, rss, dref := runSync(b, bin, env, "publish", "--store", storeURI, "--checkpoint", bdir, "--out", name, "--base-dir", pulled)
			deltaPub, rssDelta = append(deltaPub, d), max(rssDelta, rss)
			kst := v.Open(b, storeURI)
			dv, err := dataset.OpenString(ctx, kst, dref)
			require.NoError(b, err)
			require.Equal(b, false, dv.Metrics["full"], "the second publish is a delta: %v", dv.Metrics)
			stored, _ := dv.Metrics["stored_bytes"].(float64)
			storedRatio = append(storedRatio, stored/float64(changedBytes))

			// Each round leaves the disk as it found it.
			require.NoError(b, os.RemoveAll(pulled))
			removePrefix(b, s3, "plain/"+tag+"/")
			removePrefix(b, s3, "kiln/"+name+"/")
		}
	}
	b.StopTimer()
	gb := float64(size) / (1 << 30)
	report := func(unit string, kiln, base []time.Duration) {
		ratios := make([]float64, len(kiln))
		for i := range kiln {
			ratios[i] = kiln[i].Seconds() / base[i].Seconds()
		}
		slices.Sort(ratios)
		b.ReportMetric(gb/slices.Min(kiln).Seconds(), unit+"_GiB/s")
		b.ReportMetric(ratios[len(ratios)/2], unit+"/plain_median")
		b.ReportMetric(ratios[len(ratios)-1]-ratios[0], unit+"/plain_spread")
		b.Logf("%s: kiln %v, plain %v; ratios %.3f", unit, kiln, base, ratios)
	}
	report("full_publish", fullPub, plainUp)
	report("pull", pull, plainDown)
	slices.Sort(storedRatio)
	b.ReportMetric(storedRatio[len(storedRatio)/2], "delta_stored/changed")
	b.Logf("delta publish: kiln %v (reads and hashes the whole checkpoint), plain upload of the changed bytes %v", deltaPub, plainDelta)
	b.ReportMetric(float64(max(rssFull, rssPull, rssDelta))/(1<<20), "peak_RSS_MiB")
	b.ReportMetric(float64(rssFull)/(1<<20), "full_publish_RSS_MiB")
	b.ReportMetric(float64(rssPull)/(1<<20), "pull_RSS_MiB")
	b.ReportMetric(float64(rssDelta)/(1<<20), "delta_publish_RSS_MiB")
}

// runSync runs the kiln-sync binary and returns its wall time, its peak
// RSS in bytes and its last stdout line (the committed reference, or the
// pulled directory).
//
// The peak RSS is measured by /usr/bin/time (GNU time's %M), not from
// this process's wait4: Go starts a child with clone(CLONE_VM|CLONE_VFORK),
// and Linux carries the high-water RSS of the mm an exec replaces into the
// new program's maxrss, so the child's rusage reports at least this
// benchmark's own peak (checked: /bin/true started by a Go process holding
// 300 MiB reports 302 MiB; under /usr/bin/time, 1 MiB). time forks from
// its own small mm, so %M is kiln-sync's alone. Without /usr/bin/time the
// rusage figure is reported, and logged as an upper bound.
func runSync(b *testing.B, bin string, env []string, args ...string) (time.Duration, int64, string) {
	b.Helper()
	name, argv := bin, args
	rssFile := ""
	if tm, err := exec.LookPath("/usr/bin/time"); err == nil {
		rssFile = filepath.Join(b.TempDir(), "maxrss")
		name, argv = tm, append([]string{"-o", rssFile, "-f", "%M", bin}, args...)
	}
	cmd := exec.Command(name, argv...)
	cmd.Env = env
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	t0 := time.Now()
	err := cmd.Run()
	d := time.Since(t0)
	require.NoError(b, err, "kiln-sync %s: %s", strings.Join(args, " "), errb.String())
	rss := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss << 10
	how := "upper bound: includes the benchmark's own RSS (no /usr/bin/time)"
	if rssFile != "" {
		data, err := os.ReadFile(rssFile)
		require.NoError(b, err)
		kib, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
		require.NoError(b, err, "/usr/bin/time -f %%M wrote %q", data)
		rss, how = kib<<10, "GNU time %M"
	}
	b.Logf("kiln-sync %s: %s, peak RSS %d MiB (%s)", args[0], d.Round(time.Millisecond), rss>>20, how)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	return d, rss, lines[len(lines)-1]
}

func buildSync(b *testing.B, dir string) string {
	b.Helper()
	bin := filepath.Join(dir, "kiln-sync")
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin, "github.com/kilnrl/kiln/cmd/kiln-sync")
	out, err := cmd.CombinedOutput()
	require.NoError(b, err, "building kiln-sync: %s", out)
	return bin
}

func benchEnv(b *testing.B, key string, full, short int64) int64 {
	if s := os.Getenv(key); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		require.NoError(b, err, key)
		return n
	}
	if testing.Short() {
		return short
	}
	return full
}

type changedTensor struct {
	file string
	off  int64
	data []byte
}

// writeBenchCheckpoint writes an HF-layout checkpoint of about size bytes
// of BF16 tensors of tensorSize bytes in shards of about shardSize at a,
// and the same with every 20th tensor's bytes redrawn at bdir (same
// headers, so a delta applies). It streams: memory is one tensor.
func writeBenchCheckpoint(b *testing.B, a, bdir string, size, tensorSize, shardSize int64) []changedTensor {
	b.Helper()
	require.NoError(b, os.MkdirAll(a, 0o755))
	require.NoError(b, os.MkdirAll(bdir, 0o755))
	nTensors := max(size/tensorSize, 1)
	perShard := max(shardSize/tensorSize, 1)
	nShards := (nTensors + perShard - 1) / perShard
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, tensorSize)
	fill := func() {
		for i := 0; i+8 <= len(buf); i += 8 {
			binary.LittleEndian.PutUint64(buf[i:], r.Uint64())
		}
	}
	weightMap := map[string]string{}
	var changed []changedTensor
	t := int64(0)
	for s := int64(0); s < nShards; s++ {
		shard := fmt.Sprintf("model-%05d-of-%05d.safetensors", s+1, nShards)
		n := min(perShard, nTensors-t)
		header := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
		for k := int64(0); k < n; k++ {
			name := fmt.Sprintf("model.layers.%d.weight", t+k)
			header[name] = map[string]any{"dtype": "BF16", "shape": []int64{tensorSize / 2}, "data_offsets": []int64{k * tensorSize, (k + 1) * tensorSize}}
			weightMap[name] = shard
		}
		hb, err := json.Marshal(header)
		require.NoError(b, err)
		for len(hb)%8 != 0 {
			hb = append(hb, ' ')
		}
		fa, err := os.Create(filepath.Join(a, shard))
		require.NoError(b, err)
		fb, err := os.Create(filepath.Join(bdir, shard))
		require.NoError(b, err)
		var lenb [8]byte
		binary.LittleEndian.PutUint64(lenb[:], uint64(len(hb)))
		for _, f := range []*os.File{fa, fb} {
			_, err = f.Write(append(lenb[:], hb...))
			require.NoError(b, err)
		}
		for k := int64(0); k < n; k++ {
			fill()
			_, err = fa.Write(buf)
			require.NoError(b, err)
			if (t+k)%20 == 7 {
				fill()
				changed = append(changed, changedTensor{file: shard, off: 8 + int64(len(hb)) + k*tensorSize, data: append([]byte(nil), buf...)})
			}
			_, err = fb.Write(buf)
			require.NoError(b, err)
		}
		require.NoError(b, fa.Close())
		require.NoError(b, fb.Close())
		t += n
	}
	index, err := json.Marshal(map[string]any{"metadata": map[string]any{"total_size": nTensors * tensorSize}, "weight_map": weightMap})
	require.NoError(b, err)
	for _, d := range []string{a, bdir} {
		for name, data := range map[string][]byte{
			"model.safetensors.index.json": index,
			"config.json":                  []byte(`{"architectures":["BenchForCausalLM"],"max_position_embeddings":4096}`),
			"tokenizer_config.json":        []byte(`{}`),
			"tokenizer.json":               []byte(`{"version":"1.0"}`),
		} {
			require.NoError(b, os.WriteFile(filepath.Join(d, name), data, 0o644))
		}
	}
	return changed
}

func engineFiles(b *testing.B, dir string) []string {
	ents, err := os.ReadDir(dir)
	require.NoError(b, err)
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func plainPut(b *testing.B, c *minio.Client, bucket, prefix, dir string, files []string) {
	g, ctx := errgroup.WithContext(context.Background())
	g.SetLimit(8)
	for _, f := range files {
		g.Go(func() error {
			_, err := c.FPutObject(ctx, bucket, prefix+f, filepath.Join(dir, f), minio.PutObjectOptions{})
			return err
		})
	}
	require.NoError(b, g.Wait())
}

func plainGet(b *testing.B, c *minio.Client, bucket, prefix, dir string, files []string) {
	require.NoError(b, os.MkdirAll(dir, 0o755))
	g, ctx := errgroup.WithContext(context.Background())
	g.SetLimit(8)
	for _, f := range files {
		g.Go(func() error {
			obj, err := c.GetObject(ctx, bucket, prefix+f, minio.GetObjectOptions{})
			if err != nil {
				return err
			}
			defer obj.Close()
			out, err := os.Create(filepath.Join(dir, f))
			if err != nil {
				return err
			}
			if _, err := io.Copy(out, obj); err != nil {
				out.Close()
				return err
			}
			if err := out.Sync(); err != nil {
				out.Close()
				return err
			}
			return out.Close()
		})
	}
	require.NoError(b, g.Wait())
}

func removePrefix(b *testing.B, st store.Store, prefix string) {
	ctx := context.Background()
	var keys []string
	require.NoError(b, st.List(ctx, prefix, func(i store.Info) error { keys = append(keys, i.Key); return nil }))
	for _, k := range keys {
		require.NoError(b, st.Delete(ctx, k))
	}
}
