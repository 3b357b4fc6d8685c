package sync

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/formats/store/storetest"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/sync/synctest"
)

// TestPublishKilled (docs/sync.md §1.1; spec §5.1 item 9): the built
// kiln-sync SIGKILLed in the middle of an upload — a full version after
// one of its files, a delta after one of its packs — leaves no version
// and latest where it was, on the local store and on versitygw; the
// number it claimed is never given out again, and the next publish is
// full, saying why.
func TestPublishKilled(t *testing.T) {
	v := storetest.VersityServer(t)
	for _, backend := range []string{"local", "s3"} {
		for _, tc := range []struct {
			point string
			full  bool // the killed publish would have been full
		}{
			{HookPublishFileStored, true},
			{HookPublishPackStored, false},
		} {
			t.Run(backend+"/"+tc.point, func(t *testing.T) {
				uri := t.TempDir()
				if backend == "s3" {
					uri = "s3://" + v.NewBucket(t) + "/store"
					for _, kv := range v.Env() { // for the in-process runs and the child
						k, val, _ := strings.Cut(kv, "=")
						t.Setenv(k, val)
					}
				}
				st, err := store.Open(uri)
				require.NoError(t, err)
				f := newFixture(t, st)
				ck := synctest.Tiny(41, 3, 4, 4096)
				v1, _ := f.publish(ck, pubOpts{})
				mutate(ck, 0.5, 7)
				dir := f.writeCk(ck)
				args := []string{"publish", "--store", uri, "--checkpoint", dir, "--out", f.name}
				if tc.full {
					args = append(args, "--full")
				}
				killAt(t, tc.point, args...)

				assert.Equal(t, v1, f.latest(), "latest stays at the last committed version")
				assert.Len(t, f.committed(), 1, "the killed publish committed nothing")
				r := run(t, args...)
				require.Equal(t, 0, r.Code, r.Stderr)
				ref, err := dataset.ParseRef(r.LastLine())
				require.NoError(t, err)
				w, err := openWeights(context.Background(), st, ref)
				require.NoError(t, err)
				assert.Equal(t, int64(3), w.Number, "number 2 died with the killed publish and is never reused")
				assert.True(t, w.Full)
				if !tc.full {
					assert.Contains(t, w.FullReason, "2", "the full reason names the unfinished publish: %q", w.FullReason)
				}
				assert.Equal(t, ref, f.latest())
			})
		}
	}
}

// killAt runs the test binary as kiln-sync with args until it reaches the
// hook point, then SIGKILLs it.
func killAt(t *testing.T, point string, args ...string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "KILN_TEST_HELPER=1", "KILN_TEST_PAUSE_AT="+point)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = cmd.Stdout
	require.NoError(t, cmd.Start())
	var lines []string
	paused := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "PAUSED "+point {
				paused <- true
				return
			}
			lines = append(lines, sc.Text())
		}
		paused <- false
	}()
	select {
	case ok := <-paused:
		require.True(t, ok, "kiln-sync %s did not reach %s:\n%s", args[0], point, strings.Join(lines, "\n"))
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("kiln-sync %s did not reach %s", args[0], point)
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	cmd.Wait()
}

// TestPublishS3CannotWrite: credentials that cannot write to the bucket
// are a clear error naming the store, and nothing is published.
func TestPublishS3CannotWrite(t *testing.T) {
	v := storetest.VersityServer(t)
	bucket := v.NewBucket(t)
	uri := "s3://" + bucket + "/store"
	ck := synctest.Tiny(43, 1, 2, 1024)
	dir := t.TempDir()
	require.NoError(t, ck.Write(dir))
	for _, kv := range v.Env() {
		k, val, _ := strings.Cut(kv, "=")
		t.Setenv(k, val)
	}
	t.Setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
	r := run(t, "publish", "--store", uri, "--checkpoint", dir, "--out", "weights/denied")
	assert.NotEqual(t, 0, r.Code)
	assert.NotEqual(t, stagecmd.ExitUsage, r.Code, r.Stderr)
	assert.Contains(t, r.Stderr, bucket, "the error names the store")
	assert.Empty(t, strings.TrimSpace(r.Stdout), "no reference is printed")

	st := v.Open(t, uri)
	var keys []string
	require.NoError(t, st.List(context.Background(), "", func(i store.Info) error { keys = append(keys, i.Key); return nil }))
	assert.Empty(t, keys, "nothing was written: %v", keys)
	t.Logf("the refusal: %s", r.Stderr)
}
