package store_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/formats/store/storetest"
)

// versityQuirks: versitygw v1.8.0's posix back end reads an object's ETag
// by path and then opens the file, so a GET racing a replacement can pair
// one version's bytes with the next version's ETag.
var versityQuirks = storetest.Quirks{StaleGetETag: "versitygw v1.8.0 posix reads the ETag and the file separately"}

func TestS3Conformance(t *testing.T) {
	v := storetest.VersityServer(t)
	t.Run("prefix", func(t *testing.T) {
		storetest.RunWithQuirks(t, versityQuirks, func(t *testing.T) store.Store {
			return v.Open(t, "s3://"+v.NewBucket(t)+"/some/prefix")
		})
	})
	t.Run("bucket-root", func(t *testing.T) {
		storetest.RunWithQuirks(t, versityQuirks, func(t *testing.T) store.Store {
			return v.Open(t, "s3://"+v.NewBucket(t))
		})
	})
}

// Stores under sibling prefixes of one bucket do not see each other.
func TestS3PrefixIsolation(t *testing.T) {
	ctx := t.Context()
	v := storetest.VersityServer(t)
	bucket := v.NewBucket(t)
	p := v.Open(t, "s3://"+bucket+"/p")
	p2 := v.Open(t, "s3://"+bucket+"/p2")
	root := v.Open(t, "s3://"+bucket)
	_, err := p.Put(ctx, "k", bytes.NewReader([]byte("p")), 1)
	require.NoError(t, err)
	_, err = p2.Put(ctx, "k", bytes.NewReader([]byte("p2")), 2)
	require.NoError(t, err)

	keys := func(s store.Store) []string {
		var ks []string
		require.NoError(t, s.List(ctx, "", func(i store.Info) error { ks = append(ks, i.Key); return nil }))
		return ks
	}
	require.Equal(t, []string{"k"}, keys(p))
	require.Equal(t, []string{"k"}, keys(p2))
	require.ElementsMatch(t, []string{"p/k", "p2/k"}, keys(root))
	b, _, err := store.ReadAll(ctx, p, "k")
	require.NoError(t, err)
	require.Equal(t, "p", string(b))
	_, err = p.PutIfAbsent(ctx, "k", bytes.NewReader([]byte("x")), 1)
	require.ErrorIs(t, err, store.ErrExist)
	require.NoError(t, p.Delete(ctx, "k"))
	_, err = p2.Stat(ctx, "k")
	require.NoError(t, err, "deleting p/k must leave p2/k")
}

// Leftovers reports incomplete multipart uploads under the store's prefix,
// and RemoveLeftover aborts exactly the one reported.
func TestS3Leftovers(t *testing.T) {
	ctx := t.Context()
	v := storetest.VersityServer(t)
	bucket := v.NewBucket(t)
	s := v.Open(t, "s3://"+bucket+"/pre")
	core := minio.Core{Client: s.Client()}

	oldID, err := core.NewMultipartUpload(ctx, bucket, "pre/dead/writer", minio.PutObjectOptions{})
	require.NoError(t, err)
	_, err = core.NewMultipartUpload(ctx, bucket, "elsewhere/x", minio.PutObjectOptions{})
	require.NoError(t, err)
	time.Sleep(1100 * time.Millisecond) // initiation times have one-second resolution
	cutoff := time.Now()
	time.Sleep(1100 * time.Millisecond)
	newID, err := core.NewMultipartUpload(ctx, bucket, "pre/dead/writer", minio.PutObjectOptions{})
	require.NoError(t, err)

	collect := func(olderThan time.Time) []store.Info {
		var got []store.Info
		require.NoError(t, s.Leftovers(ctx, olderThan, func(i store.Info) error {
			got = append(got, i)
			return nil
		}))
		return got
	}
	all := collect(time.Now().Add(time.Hour))
	require.Len(t, all, 2, "both uploads under the prefix, not the one elsewhere: %+v", all)
	got := collect(cutoff)
	require.Len(t, got, 1, "only the upload older than the cutoff: %+v", got)
	require.Equal(t, "dead/writer", got[0].Key)
	require.Contains(t, got[0].ETag, oldID)

	var keys []string
	require.NoError(t, s.List(ctx, "", func(i store.Info) error { keys = append(keys, i.Key); return nil }))
	require.Empty(t, keys, "leftovers are not objects")

	// Removing the old upload must not abort the live writer's newer upload
	// of the same key.
	require.NoError(t, s.RemoveLeftover(ctx, got[0]))
	left := collect(time.Now().Add(time.Hour))
	require.Len(t, left, 1, "RemoveLeftover removed more than the leftover it was given")
	require.Contains(t, left[0].ETag, newID)
	require.NoError(t, s.RemoveLeftover(ctx, left[0]))
	require.Empty(t, collect(time.Now().Add(time.Hour)))
}

// store.Open reaches versitygw through the environment VersityEnv gives,
// both in this process and in a child process.
func TestS3OpenFromEnv(t *testing.T) {
	ctx := t.Context()
	_, env, uri := storetest.VersityEnv(t)
	// Whatever AWS settings the developer has must not leak into the child.
	t.Setenv("AWS_ACCESS_KEY_ID", "bogus")
	t.Setenv("AWS_SESSION_TOKEN", "bogus")
	t.Setenv("KILN_S3_ENDPOINT", "http://127.0.0.1:9")

	cmd := exec.Command(os.Args[0], "-test.run=^TestS3ChildProcess$", "-test.v")
	cmd.Env = append(append(os.Environ(), env...), "KILN_TEST_CHILD_URI="+uri)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child:\n%s", out)
	require.Contains(t, string(out), "--- PASS: TestS3ChildProcess", "child:\n%s", out)

	for _, kv := range env {
		k, val, _ := strings.Cut(kv, "=")
		t.Setenv(k, val)
	}
	s, err := store.Open(uri)
	require.NoError(t, err)
	b, _, err := store.ReadAll(ctx, s, "from/child")
	require.NoError(t, err)
	require.Equal(t, "written by a child process", string(b))
}

// TestS3ChildProcess runs only as TestS3OpenFromEnv's child.
func TestS3ChildProcess(t *testing.T) {
	uri := os.Getenv("KILN_TEST_CHILD_URI")
	if uri == "" {
		t.Skip("runs as a child of TestS3OpenFromEnv")
	}
	s, err := store.Open(uri)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err = s.PutIfAbsent(ctx, "from/child", bytes.NewReader([]byte("written by a child process")), 26)
	require.NoError(t, err)
}

// Conditional writes of objects bigger than one part go through multipart
// uploads, whose condition must travel with CompleteMultipartUpload.
func TestS3MultipartConditional(t *testing.T) {
	const part = 5 << 20
	defer store.SetS3PartSize(part)()
	ctx := t.Context()
	s := storetest.StartVersity(t)
	big := func(seed byte) []byte {
		b := bytes.Repeat([]byte{seed}, 2*part+12345)
		b[0], b[len(b)-1] = 'A', 'Z'
		return b
	}
	read := func(key string) ([]byte, store.Info) {
		b, info, err := store.ReadAll(ctx, s, key)
		require.NoError(t, err)
		return b, info
	}
	type sizer func([]byte) int64
	for _, sz := range []struct {
		name string
		size sizer
	}{
		{"known", func(b []byte) int64 { return int64(len(b)) }},
		{"unknown", func([]byte) int64 { return -1 }},
	} {
		t.Run(sz.name, func(t *testing.T) {
			key := "mp/" + sz.name
			v1, v2, v3 := big('1'), big('2'), big('3')
			info, err := s.PutIfAbsent(ctx, key, onlyReader{bytes.NewReader(v1)}, sz.size(v1))
			require.NoError(t, err, "PutIfAbsent of an absent key")
			b, got := read(key)
			require.True(t, bytes.Equal(v1, b))
			require.Equal(t, got.ETag, info.ETag)
			require.Contains(t, info.ETag, "-", "a multipart ETag: the multipart path ran")

			_, err = s.PutIfAbsent(ctx, key, onlyReader{bytes.NewReader(v2)}, sz.size(v2))
			require.ErrorIs(t, err, store.ErrExist, "PutIfAbsent of an existing key")
			b, _ = read(key)
			require.True(t, bytes.Equal(v1, b), "a failed PutIfAbsent replaced the object")

			info2, err := s.PutIfMatch(ctx, key, onlyReader{bytes.NewReader(v2)}, sz.size(v2), info.ETag)
			require.NoError(t, err, "PutIfMatch with the current ETag")
			_, err = s.PutIfMatch(ctx, key, onlyReader{bytes.NewReader(v3)}, sz.size(v3), info.ETag)
			require.ErrorIs(t, err, store.ErrPrecondition, "PutIfMatch with a stale ETag")
			b, got = read(key)
			require.True(t, bytes.Equal(v2, b), "a failed PutIfMatch replaced the object")
			require.Equal(t, info2.ETag, got.ETag)

			_, err = s.PutIfMatch(ctx, key+"-absent", onlyReader{bytes.NewReader(v3)}, sz.size(v3), info.ETag)
			require.ErrorIs(t, err, store.ErrPrecondition, "PutIfMatch of an absent key")
			_, err = s.Stat(ctx, key+"-absent")
			require.ErrorIs(t, err, store.ErrNotExist)

			if sz.name == "known" {
				_, err = s.PutIfAbsent(ctx, key+"-short", onlyReader{bytes.NewReader(v3[:len(v3)-1])}, int64(len(v3)))
				require.Error(t, err, "a reader shorter than its size")
				_, err = s.PutIfAbsent(ctx, key+"-long", onlyReader{bytes.NewReader(v3)}, int64(len(v3)-1))
				require.Error(t, err, "a reader longer than its size")
				_, err = s.Put(ctx, key+"-long", onlyReader{bytes.NewReader(v3)}, int64(len(v3)-1))
				require.Error(t, err, "a reader longer than its size")
				for _, k := range []string{key + "-short", key + "-long"} {
					_, err = s.Stat(ctx, k)
					require.ErrorIs(t, err, store.ErrNotExist, "after a failed write of %q", k)
				}
			}
		})
	}
	// Failed uploads were aborted.
	var left []store.Info
	require.NoError(t, s.Leftovers(ctx, time.Now().Add(time.Hour), func(i store.Info) error {
		left = append(left, i)
		return nil
	}))
	require.Empty(t, left, "failed multipart uploads must be aborted")
}

type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

// An unconditional write of known size above one part goes up in parts of
// at most 16 MiB (what minio-go buffers per upload), more only where
// 10000 parts would not hold the object; its bytes come back whole, and a
// reader that is longer or shorter than the size is refused.
func TestS3SizedMultipart(t *testing.T) {
	const mib = 1 << 20
	require.Equal(t, int64(16*mib), store.SizedPartSize(8<<30))
	for _, size := range []int64{100 << 30, 200 << 30, 1 << 40, 5<<40 - 1} {
		p := store.SizedPartSize(size)
		require.GreaterOrEqual(t, p*10000, size, "10000 parts of %d hold %d", p, size)
		require.Zero(t, p%mib, "whole MiB")
		require.LessOrEqual(t, p, max(16*mib, (size+9999)/10000+mib), "no bigger than needed")
	}

	const part = 5 << 20
	defer store.SetS3PartSize(part)()
	require.Equal(t, int64(part), store.SizedPartSize(3*part), "tests' smaller part size holds")
	ctx := t.Context()
	s := storetest.StartVersity(t)
	b := bytes.Repeat([]byte("0123456789abcdef"), (2*part+12345)/16)
	b[0], b[len(b)-1] = 'A', 'Z'
	info, err := s.Put(ctx, "sized/ok", onlyReader{bytes.NewReader(b)}, int64(len(b)))
	require.NoError(t, err)
	require.True(t, strings.HasSuffix(info.ETag, "-3"), "3 parts of %d bytes: ETag %q", part, info.ETag)
	got, _, err := store.ReadAll(ctx, s, "sized/ok")
	require.NoError(t, err)
	require.True(t, bytes.Equal(b, got))

	_, err = s.Put(ctx, "sized/long", onlyReader{bytes.NewReader(b)}, int64(len(b)-1))
	require.Error(t, err, "a reader longer than its size")
	_, err = s.Put(ctx, "sized/short", onlyReader{bytes.NewReader(b[:len(b)-1])}, int64(len(b)))
	require.Error(t, err, "a reader shorter than its size")
	for _, k := range []string{"sized/long", "sized/short"} {
		_, err := s.Stat(ctx, k)
		require.ErrorIs(t, err, store.ErrNotExist, "%s: nothing stored", k)
	}
}

// TestS3URIRefusesCredentials: a store URI carrying KEY:SECRET@ is
// refused, and the error never repeats the secret (it would land in
// sbatch scripts, manifests and logs; issue 31).
func TestS3URIRefusesCredentials(t *testing.T) {
	for _, uri := range []string{"s3://AKIAKEY:TOPSECRET@bucket/prefix", "s3://TOPSECRET@bucket", "s3://AKIAKEY:TOPSECRET@/x"} {
		_, err := store.Open(uri)
		if err == nil {
			t.Fatalf("Open(%q) accepted a URI with credentials", uri)
		}
		if strings.Contains(err.Error(), "TOPSECRET") || strings.Contains(err.Error(), "AKIAKEY") {
			t.Errorf("Open(%q): the error repeats the credentials: %v", uri, err)
		}
	}
}
