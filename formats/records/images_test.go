package records

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestImagesRoundTrip(t *testing.T) {
	wd, pp := "/testbed", "/root/.pyenv/shims"
	rows := []Image{
		{Image: "kiln.local/fixtures:a", Digest: "sha256:" + string(bytes.Repeat([]byte("a"), 64)), Bundle: "sha256/" + string(bytes.Repeat([]byte("a"), 64)),
			Env: `{"PATH":"/usr/bin","LANG":"C"}`, Workdir: &wd, ConfigWorkdir: "/", Command: `["bash"]`, Source: "oci:/l", SizeBytes: 10, Files: 2, EnvPathPrepend: &pp},
		{Image: "b", Digest: "sha256:" + string(bytes.Repeat([]byte("b"), 64)), Bundle: "sha256/bb", Env: `{}`, ConfigWorkdir: "/srv", Command: `[]`, Source: "registry"},
	}
	var buf bytes.Buffer
	enc := NewImageEncoder(&buf)
	require.NoError(t, enc.Write(rows...))
	require.NoError(t, enc.Close())
	var got []Image
	require.NoError(t, EachImage(buf.Bytes(), func(im Image) error { got = append(got, im); return nil }))
	assert.Equal(t, rows, got)

	var views []string
	require.NoError(t, ImagesKind().EachJSON(buf.Bytes(), func(row json.RawMessage) error { views = append(views, string(row)); return nil }))
	assert.Equal(t, `{"image":"b","digest":"sha256:`+string(bytes.Repeat([]byte("b"), 64))+`","bundle":"sha256/bb","env":{},"workdir":null,"config_workdir":"/srv","command":[],"source":"registry","size_bytes":0,"files":0,"env_path_prepend":null}`, views[1])
	assert.Contains(t, views[0], `"env":{"PATH":"/usr/bin","LANG":"C"}`, "env embedded, key order kept")

	k, err := Lookup("images")
	require.NoError(t, err)
	assert.Equal(t, ImagesKind().Fingerprint(), k.Fingerprint())
}

func TestImagesValidate(t *testing.T) {
	ok := Image{Image: "i", Digest: "sha256:" + string(bytes.Repeat([]byte("c"), 64)), Bundle: "sha256/c", Env: "{}", Command: "[]"}
	require.NoError(t, ok.Validate())
	cases := []struct {
		name string
		edit func(*Image)
		want string
	}{
		{"no image", func(im *Image) { im.Image = "" }, "empty image"},
		{"bad digest", func(im *Image) { im.Digest = "md5:x" }, "is not sha256"},
		{"absolute bundle", func(im *Image) { im.Bundle = "/abs" }, "relative to the bundle root"},
		{"escaping bundle", func(im *Image) { im.Bundle = "../x" }, "relative to the bundle root"},
		{"env not an object", func(im *Image) { im.Env = `["PATH=/bin"]` }, "env is not a JSON object"},
		{"command not an array", func(im *Image) { im.Command = `"bash"` }, "command is not a JSON array"},
	}
	for _, c := range cases {
		im := ok
		c.edit(&im)
		assert.ErrorContains(t, im.Validate(), c.want, c.name)
	}
}

func TestImageEnvList(t *testing.T) {
	for _, c := range []struct {
		env  string
		want []string
		err  bool
	}{
		{env: `{"PATH":"/usr/bin","A":"x=y"}`, want: []string{"PATH=/usr/bin", "A=x=y"}},
		{env: `{}`},
		{env: `[]`, err: true},
		{env: `{"A":1}`, err: true},
		{env: `{"A":"x"`, err: true},
	} {
		got, err := Image{Env: c.env}.EnvList()
		if c.err {
			if err == nil {
				t.Errorf("EnvList(%s) = %q, want an error", c.env, got)
			}
			continue
		}
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("EnvList(%s) = %q, %v; want %q", c.env, got, err, c.want)
		}
	}
}
