package store_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/store"
)

func TestCheckKey(t *testing.T) {
	for _, k := range []string{
		"a", "a/b", "a/b/c.parquet", "x.kiln", "a/.kiln", "a/.kiln-tmp/b", ".hidden", "..a", "a..", "a/...",
		"sp ace", "ünï/κλειδί", "a+b%20c", "q?x#y",
	} {
		require.NoError(t, store.CheckKey(k), "CheckKey(%q)", k)
	}
	for _, k := range []string{
		"", "/", "/a", "a/", "a//b", ".", "..", "./a", "../a", "a/.", "a/..", "a/./b", "a/../b",
		".kiln", ".kiln-tmp/x", ".kilnx", ".kiln/x", `a\b`, `\`, "a\x00b",
	} {
		require.ErrorIs(t, store.CheckKey(k), store.ErrInvalidKey, "CheckKey(%q)", k)
	}
}

func TestOpen(t *testing.T) {
	t.Setenv("KILN_S3_ENDPOINT", "http://127.0.0.1:9")
	t.Setenv("AWS_REGION", "us-east-1")
	dir := t.TempDir()

	t.Run("plain path", func(t *testing.T) {
		s, err := store.Open(dir)
		require.NoError(t, err)
		l, ok := s.(*store.Local)
		require.True(t, ok, "Open(%q) = %T, want *store.Local", dir, s)
		require.Equal(t, dir, l.Root())
		require.Equal(t, "file://"+dir, s.URI())
	})
	t.Run("relative path", func(t *testing.T) {
		t.Chdir(dir)
		s, err := store.Open("data/sub")
		require.NoError(t, err)
		require.Equal(t, filepath.Join(dir, "data", "sub"), s.(*store.Local).Root())
		s, err = store.Open(store.DefaultURI)
		require.NoError(t, err)
		require.Equal(t, filepath.Join(dir, "data"), s.(*store.Local).Root())
	})
	t.Run("file URI", func(t *testing.T) {
		s, err := store.Open("file://" + dir + "/x")
		require.NoError(t, err)
		require.Equal(t, filepath.Join(dir, "x"), s.(*store.Local).Root())
		// URI round-trips through Open.
		s2, err := store.Open(s.URI())
		require.NoError(t, err)
		require.Equal(t, s.URI(), s2.URI())
	})
	t.Run("s3", func(t *testing.T) {
		for uri, want := range map[string]struct{ bucket, uri string }{
			"s3://bucket/prefix":       {"bucket", "s3://bucket/prefix"},
			"s3://bucket/prefix/":      {"bucket", "s3://bucket/prefix"},
			"s3://bucket/a/b/c":        {"bucket", "s3://bucket/a/b/c"},
			"s3://bucket":              {"bucket", "s3://bucket"},
			"s3://bucket/":             {"bucket", "s3://bucket"},
			"s3://my-bucket.1/x.kiln/": {"my-bucket.1", "s3://my-bucket.1/x.kiln"},
		} {
			s, err := store.Open(uri)
			require.NoError(t, err, "Open(%q)", uri)
			s3, ok := s.(*store.S3)
			require.True(t, ok, "Open(%q) = %T, want *store.S3", uri, s)
			require.Equal(t, want.bucket, s3.Bucket(), "Open(%q).Bucket()", uri)
			require.Equal(t, want.uri, s.URI(), "Open(%q).URI()", uri)
			s2, err := store.Open(s.URI())
			require.NoError(t, err)
			require.Equal(t, s.URI(), s2.URI(), "URI round-trips through Open")
		}
	})
	t.Run("errors", func(t *testing.T) {
		for _, uri := range []string{
			"",
			"s3://", "s3:///prefix", // no bucket
			"s3://bucket/a//b", "s3://bucket/../x", "s3://bucket/.kiln-tmp", // bad prefix
			"gs://bucket/x", "http://host/x", "ftp://x", "mem://", // unknown schemes
			"s3:/bucket/x", "s3:bucket", "file:relative", // malformed
		} {
			s, err := store.Open(uri)
			require.Error(t, err, "Open(%q) = %v", uri, s)
		}
		_, err := store.Open("gs://bucket/x")
		require.ErrorContains(t, err, "unknown scheme")
		_, err = store.Open("s3:///prefix")
		require.ErrorContains(t, err, "s3://bucket")
		_, err = store.Open("s3://bucket/a//b")
		require.ErrorIs(t, err, store.ErrInvalidKey)
	})
	t.Run("bad endpoint", func(t *testing.T) {
		t.Setenv("KILN_S3_ENDPOINT", "ftp://host:21")
		_, err := store.Open("s3://bucket/x")
		require.ErrorContains(t, err, "endpoint")
	})
}

func TestURIFromEnv(t *testing.T) {
	t.Setenv("KILN_STORE", "")
	require.Equal(t, store.DefaultURI, store.URIFromEnv())
	t.Setenv("KILN_STORE", "s3://b/p")
	require.Equal(t, "s3://b/p", store.URIFromEnv())
}
